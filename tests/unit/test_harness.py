"""The harness's instrument modules: named in a job spec, found where this process imports them, bad names refused
before any rank starts; the extensions folder the ranks build into, freed of a killed build's lock."""
import subprocess
import sys
from pathlib import Path

import pytest

from harness.launch import extensions_claimed, instrument_root, run_job

ROOT = Path(__file__).resolve().parents[2]
SPEC = {"model": "bert", "dtype": "bf16", "patch": True, "runs": [{"name": "baseline"}]}


@pytest.mark.parametrize("name", ["tests.harness_instruments", "harness.qgz_instruments", "tests"])
def test_ranks_import_instruments_from_where_this_process_does(name):
    """A module in a package and a package itself."""
    assert instrument_root(name) == str(ROOT)


def test_ranks_import_instruments_from_a_namespace_package(tmp_path, monkeypatch):
    """A module in a folder without __init__.py: the root is the folder above it."""
    (tmp_path / "loose").mkdir()
    (tmp_path / "loose" / "probe.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert instrument_root("loose.probe") == str(tmp_path)


@pytest.mark.parametrize("names", [42, ["tests.harness_instruments", None], {"tests.harness_instruments": True}])
def test_instruments_of_the_wrong_type_are_refused(names):
    with pytest.raises(ValueError, match=r"spec\['instruments'\] is .*expected a module name or a list"):
        run_job(dict(SPEC, instruments=names))


@pytest.mark.parametrize("name", ["tests.no_such_instruments", "no_such_package.instruments"])
def test_unknown_instrument_module_is_refused(name):
    with pytest.raises(ValueError, match=rf"spec\['instruments'\]: no module '{name}' importable here"):
        run_job(dict(SPEC, instruments=[name]))


def test_a_killed_builds_lock_is_removed_when_no_launcher_holds_the_folder(tmp_path, capsys):
    """Torch's JIT build waits forever on a ``lock`` file that a killed build left behind."""
    (tmp_path / "deepspeed_shm_comm").mkdir()
    lock = tmp_path / "deepspeed_shm_comm" / "lock"
    lock.write_text("")
    with extensions_claimed(str(tmp_path)):
        assert not lock.exists()
    assert "left by a build that was killed" in capsys.readouterr().err


def test_a_lock_stays_while_another_launcher_holds_the_folder(tmp_path):
    """Another process's launcher (holding the folder until it reads stdin) may have ranks building right now."""
    (tmp_path / "deepspeed_shm_comm").mkdir()
    lock = tmp_path / "deepspeed_shm_comm" / "lock"
    holder = subprocess.Popen([
        sys.executable, "-c", "import sys; from harness.launch import extensions_claimed\n"
        f"with extensions_claimed({str(tmp_path)!r}):\n    print('held', flush=True); sys.stdin.read()"
    ],
                              cwd=ROOT,
                              stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        lock.write_text("")
        with extensions_claimed(str(tmp_path)):
            assert lock.exists()
    finally:
        holder.communicate("")
    with extensions_claimed(str(tmp_path)):  # the holder is gone: the lock is a leftover now
        assert not lock.exists()
