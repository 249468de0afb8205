"""The support table takes each release's row from a whole test run of its own; a plain test run writes no report
(nor anything else) into the checkout."""
import configparser
from pathlib import Path

from tests.compat import matrix

ROOT = Path(__file__).resolve().parents[2]
FAILED = ('<testsuites><testsuite><testcase classname="tests.unit.test_any" name="test_one"><failure message="x"/>'
          '</testcase></testsuite></testsuites>')


def test_pytest_ini_writes_nothing_into_the_checkout():
    ini = configparser.ConfigParser()
    ini.read(ROOT / "pytest.ini")
    addopts = ini["pytest"].get("addopts", "").split()
    assert not [opt for opt in addopts if opt.startswith(("--junit", "--report-log", "--result-log"))], addopts
    assert "no:cacheprovider" in addopts, addopts


def test_installed_release_row_from_a_named_report_only(tmp_path, monkeypatch):
    """A report left in the cache (say of a ``pytest -k`` run) is not a row; a report named by --installed-junit is,
    without running the tests again."""
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "junit-installed.xml").write_text(FAILED)
    named = tmp_path / "junit.xml"
    named.write_text(FAILED)
    monkeypatch.setattr(matrix, "CACHE", cache)
    monkeypatch.setattr(matrix, "TABLE", tmp_path / "table.md")
    runs = []
    monkeypatch.setattr(matrix, "run_tests",
                        lambda version, target: runs.append(version) or {"tests.unit.x": "passed"})
    installed = matrix.installed_version()
    assert matrix.main(["--versions", installed, "--no-readme"]) == 0
    assert runs == [installed]
    assert matrix.main(["--versions", installed, "--no-readme", "--installed-junit", str(named)]) == 1
    assert runs == [installed]
    table = (tmp_path / "table.md").read_text()
    assert f"| {installed} (installed) |" in table.splitlines()[0]
    assert "| unit tests | FAIL (1/1) |" in table


def test_installed_column_merges_reports_and_other_releases_skip_installed_only_files(tmp_path, monkeypatch):
    """.ci/run names two reports (the README's test command, then the slow files): the column holds both. Another
    release runs without the INSTALLED_ONLY files, and its cells there say "—" (not run), not "pass"."""
    quick, slow = tmp_path / "quick.xml", tmp_path / "slow.xml"
    quick.write_text('<testsuites><testsuite><testcase classname="tests.unit.test_any" name="test_one"/>'
                     '</testsuite></testsuites>')
    slow.write_text('<testsuites><testsuite><testcase classname="tests.multirank.test_agreement" name="test_two"/>'
                    '</testsuite></testsuites>')
    monkeypatch.setattr(matrix, "CACHE", tmp_path)
    monkeypatch.setattr(matrix, "TABLE", tmp_path / "table.md")
    commands = []

    def fake_run(command, cwd, env):
        commands.append(command)
        junit = next(arg for arg in command if arg.startswith("--junitxml="))
        Path(junit.split("=", 1)[1]).write_text(quick.read_text())

    monkeypatch.setattr(matrix, "install", lambda version: tmp_path / f"ds-{version}")
    monkeypatch.setattr(matrix.subprocess, "run", fake_run)
    installed = matrix.installed_version()
    argv = ["--versions", "0.0.1", installed, "--no-readme", "--installed-junit", str(quick), str(slow)]
    assert matrix.main(argv) == 0
    left_out = [c.split("=", 1)[1] for c in commands[0] if c.startswith(("--ignore=", "--deselect="))]
    assert left_out == list(matrix.INSTALLED_ONLY)
    rows = {line.split(" | ")[0]: line for line in (tmp_path / "table.md").read_text().splitlines()}
    assert rows["| one packet per fetch, agreement, simulate"].endswith("| — | pass |")
    assert rows["| unit tests"].endswith("| pass | pass |")


def test_table_rows_and_installed_only_files_name_tests_that_exist():
    """A renamed test or file would leave its row "—" on every release, or run on every release without a word."""
    sources = {path: path.read_text() for path in (ROOT / "tests").rglob("test_*.py")}
    for path in matrix.INSTALLED_ONLY:
        path, _, test = path.partition("::")
        assert (ROOT / path).is_file() and (not test or f"def {test}(" in (ROOT / path).read_text()), path
    for title, keys in matrix.ROWS:
        for key in keys:
            if key.startswith("tests."):
                assert (ROOT / (key.rstrip(".").replace(".", "/") + ".py")).is_file() or (
                    ROOT / key.rstrip(".").replace(".", "/")).is_dir(), (title, key)
            else:
                assert any(f"def {key}(" in text for text in sources.values()), (title, key)
