"""Compatibility run: the unit and multi-rank tests against each DeepSpeed release in versions.txt.

Each release is installed into its own directory (``--target``, no dependencies: the CI environment already
has what they need) and put first on PYTHONPATH for one pytest run. The per-test outcomes become the support table
(tests/compat/support_table.md, and the README's between the ``support-table`` markers unless ``--no-readme``): one
row per feature, one column per release, each cell what ran there.

    python -m tests.compat.matrix [--versions 0.14.4 0.19.8] [--no-readme] [--installed-junit PATH ...]
    python -m tests.compat.matrix --report-only --installed-junit PATH ...   # the table of the last runs, into README

Other releases run every unit and multi-rank test except the files and tests of ``INSTALLED_ONLY``, whose outcome
does not depend on the DeepSpeed release (a row of them only reads "—" there). The DeepSpeed installed in the running environment is not
reinstalled. Its outcomes come from a fresh run of every tier, or from the JUnit reports named by
``--installed-junit`` (.ci/run passes those of its two runs: the README's test command, then the slow files), so that
run is not repeated.
"""
import argparse
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / ".compat"
TABLE = Path(__file__).with_name("support_table.md")
START, END = "<!-- support-table:start -->", "<!-- support-table:end -->"

# Files run with the installed release only, and why their outcome is the same on every release:
INSTALLED_ONLY = (
    "tests/multirank/test_activation.py",  # the import hook, the launchers and the examples: ours, not DeepSpeed's
    "tests/unit/test_install.py",  # packaging
    "tests/multirank/test_agreement.py",  # the check runs in our entry points, through the store
    "tests/multirank/test_fake_world.py",  # the same check's skip in torch's fake world (one process for 8 ranks)
    "tests/multirank/test_fetch_packets.py",  # packets vs DeepSpeed's two all-gathers; every other file trains on them
    "tests/multirank/test_simulate.py",  # a smoke of the simulate command, a tool for the newest release
    "tests/multirank/test_simulate_search.py",  # the same command's search, end to end
    # our batching of qgZ's all-to-alls, called directly (the qgZ training test runs through DeepSpeed everywhere)
    "tests/multirank/test_qgz.py::test_shared_all_to_alls_change_no_bit",
)

# Rows of the support table: a title and the test ids (substrings) whose outcomes it summarises.
ROWS = (
    ("unit tests", ("tests.unit.", )),
    ("qwZ bf16, the BERT of the crash (coalesced gather)", ("test_bert_bf16_coalesced_issue_7775",
                                                            "test_bert_bf16_persistent_parameters_in_one_all_gather")),
    ("qwZ fp32, sequential gather, bf16 + fp32 in one bucket", ("test_bert_fp32", "test_bert_bf16_sequential",
                                                                "test_bucket_mixing_bf16_and_fp32")),
    ("unpatched run fails as upstream does", ("test_unpatched_reproduces_upstream_failure", )),
    ("inert without a ZeRO++ flag (bit for bit stock)", ("tests.multirank.test_inert.", )),
    ("MixZ++ bf16, defect fixes, exports, CPU offload", ("tests.multirank.test_mixz.",
                                                         "tests.multirank.test_export.")),
    ("LoRA (PEFT, Llama)", ("test_lora_frozen_bf16_base_fp32_adapters", )),
    ("checkpoint round trip", ("test_checkpoint_round_trip", )),
    ("hpZ, 4 ranks", ("test_hpz_four_ranks_bf16", )),
    ("qgZ bf16/fp32", ("tests.multirank.test_qgz.", )),
    ("qgZ + LoCo bf16/fp32", ("tests.multirank.test_loco.", )),
    ("DEEPSPEED_ZEROPP=1 (HF Trainer, launchers), install", ("tests.multirank.test_activation.",
                                                             "tests.unit.test_install.")),
    ("one packet per fetch, agreement, simulate",
     ("tests.multirank.test_fetch_packets.", "tests.multirank.test_agreement.", "tests.multirank.test_fake_world.",
      "tests.multirank.test_simulate.", "tests.multirank.test_simulate_search.")),
)


def versions_from_file():
    lines = (Path(__file__).with_name("versions.txt")).read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def install(version):
    target = CACHE / f"ds-{version}"
    if not (target / "deepspeed").is_dir():
        subprocess.run([
            sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target",
            str(target), f"deepspeed=={version}"
        ],
                       check=True,
                       env=dict(os.environ, DS_BUILD_OPS="0"))
    return target


def installed_version():
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("deepspeed")
    except PackageNotFoundError:
        return None


def run_tests(version, target):
    junit = CACHE / f"junit-{version}.xml"
    paths = [str(ROOT)] if target is None else [str(target), str(ROOT)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths), DS_ACCELERATOR="cpu")
    env.pop("PYTEST_ADDOPTS", None)  # the same selection and report for every release, whatever the caller's options
    command = [sys.executable, "-m", "pytest", "-q", f"--junitxml={junit}", "tests/unit", "tests/multirank"]
    if target is not None:
        command += [f"--deselect={path}" if "::" in path else f"--ignore={path}" for path in INSTALLED_ONLY]
    subprocess.run(command, cwd=ROOT, env=env)
    return read_junit(junit)


def read_junit(*reports):
    outcomes = {}
    for case in (case for junit in reports for case in ET.parse(junit).iter("testcase")):
        test_id = f"{case.get('classname')}.{case.get('name')}"
        failed = case.find("failure") is not None or case.find("error") is not None
        outcomes[test_id] = "skipped" if case.find("skipped") is not None else ("failed" if failed else "passed")
    return outcomes


def cell(outcomes, keys):
    selected = [o for test_id, o in outcomes.items() if any(k in test_id for k in keys)]
    if not selected:
        return "—"
    failed = selected.count("failed")
    if failed:
        return f"FAIL ({failed}/{len(selected)})"
    return "pass" if "passed" in selected else "skipped"


def torch_version():
    from importlib.metadata import version
    return version("torch")


def render(results):
    """One row per feature, one column per release; the torch the tests ran with in the corner."""
    installed = installed_version()
    releases = [f"{v} (installed)" if v == installed else v for v in results]
    corner = f"DeepSpeed, with torch {torch_version()} (CPU, gloo)"
    lines = [f"| {corner} | " + " | ".join(releases) + " |", "|---" * (len(results) + 1) + "|"]
    for title, keys in ROWS:
        lines.append(f"| {title} | " + " | ".join(cell(outcomes, keys) for outcomes in results.values()) + " |")
    return "\n".join(lines) + "\n"


def update_readme(table):
    readme = ROOT / "README.md"
    text = readme.read_text()
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    readme.write_text(f"{head}{START}\n{table}{END}{tail}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--versions", nargs="*", default=None, help="releases to run (default: versions.txt)")
    parser.add_argument("--no-readme", action="store_true", help="write support_table.md only")
    parser.add_argument("--report-only", action="store_true", help="tabulate the last runs' results, run nothing")
    parser.add_argument("--installed-junit",
                        type=Path,
                        nargs="+",
                        help="JUnit reports of runs that together ran every tier with the installed DeepSpeed: its "
                        "column, not run again")
    args = parser.parse_args(argv)
    for report in args.installed_junit or ():
        if not report.is_file():
            parser.error(f"--installed-junit {report}: no such file")
    CACHE.mkdir(exist_ok=True)
    results = {}
    for version in args.versions or versions_from_file():
        print(f"== DeepSpeed {version}", flush=True)
        if version == installed_version() and args.installed_junit:
            results[version] = read_junit(*args.installed_junit)
        elif version == installed_version() and not args.report_only:
            results[version] = run_tests(version, None)
        elif args.report_only:
            results[version] = read_junit(CACHE / f"junit-{version}.xml")
        else:
            results[version] = run_tests(version, install(version))
    table = render(results)
    TABLE.write_text(table)
    if not args.no_readme:
        update_readme(table)
    print(table)
    return 1 if any("failed" in outcomes.values() for outcomes in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
