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
    assert f"| {installed} | FAIL (1/1) |" in (tmp_path / "table.md").read_text()
