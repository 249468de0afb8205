"""The README stays a five-minute read (at most 150 lines of at most 120 characters), and .ci/run runs the README's
test command exactly as written there."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SETUP = "python3 -m venv .venv && .venv/bin/pip install -q -r requirements/ci.txt . && "


def readme_commands():
    return [line for line in (ROOT / "README.md").read_text().splitlines() if line.startswith(SETUP)]


def test_readme_is_short():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 150, len(lines)
    assert [n for n, line in enumerate(lines, 1) if len(line) > 120] == []


def test_readme_has_the_two_commands_and_ci_runs_the_test_command():
    demo, tests = readme_commands()
    assert demo.endswith(".venv/bin/python -m deepspeed_zeropp demo"), demo
    assert re.search(r"\.venv/bin/(python -m )?pytest tests\b", tests), tests
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert tests in ci, "the README's test command is not a line of .ci/run"
    assert any(" -m slow" in line for line in ci), "the slow files are left out of the README's command: CI runs them"
    assert any(re.match(r"\.venv/bin/python -m tests\.compat\.matrix\b", line) for line in ci)
