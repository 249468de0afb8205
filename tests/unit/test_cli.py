"""doctor, demo and the kernel benchmark: what they print comes from checks they ran; problems give a non-zero exit."""
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import deepspeed_zeropp
from deepspeed_zeropp import cli
from deepspeed_zeropp.demo import command as demo_command
from deepspeed_zeropp.patching import sites

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def unpatched_afterwards():
    yield
    deepspeed_zeropp.unpatch()


def test_doctor_all_good(capsys):
    assert cli.main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "site CUDAQuantizer.quantize: patched" in out
    for dtype in ("float16", "bfloat16", "float32"):  # a round trip per device and dtype, fp16 on CPU included
        assert f"[     ok] round trip cpu {dtype} (backend auto, ran torch): torch.{dtype}" in out
    assert "[warning]" not in out and out.splitlines()[-1] == "doctor: everything needed is in place"


def test_doctor_shows_sites_this_release_lacks_as_not_applicable(monkeypatch, capsys):
    absent = sites.Site("AllGatherHandle", "not_in_this_release", lambda original: original, until="0.1.0")
    monkeypatch.setattr("deepspeed_zeropp.patching.apply.SITES", sites.SITES + (absent, ))
    assert cli.main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "[    n/a] site AllGatherHandle.not_in_this_release: absent in this release" in out


def test_doctor_never_says_everything_is_in_place_after_a_warning(monkeypatch, capsys):
    monkeypatch.setattr("deepspeed_zeropp.doctor._launcher_check", lambda: ("warning", "a warning of the test"))
    assert cli.main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "[warning] a warning of the test" in out and "everything needed is in place" not in out
    assert out.splitlines()[-1] == "doctor: the patch works here; read the 1 warning(s) above"


def test_doctor_prints_its_list_after_what_deepspeed_logs(monkeypatch, capsys):
    from deepspeed_zeropp import doctor
    doctor_checks = doctor.checks

    def logging_checks(backend):
        for number, check in enumerate(doctor_checks(backend)):
            if number == 3:
                print("a DeepSpeed log line")
            yield check

    monkeypatch.setattr("deepspeed_zeropp.doctor.checks", logging_checks)
    assert cli.main(["doctor"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "a DeepSpeed log line" and all(line.startswith("[") for line in lines[1:-1])


def test_doctor_leaves_deepspeed_as_it_found_it():
    from deepspeed.runtime.zero.partition_parameters import CUDAQuantizer
    before = CUDAQuantizer.__dict__["quantize"]
    cli.main(["doctor"])
    assert CUDAQuantizer.__dict__["quantize"] is before


def test_doctor_flags_a_missing_site(monkeypatch, capsys):
    ghost = sites.Site("AllGatherHandle", "no_such_method", lambda original: original)
    monkeypatch.setattr("deepspeed_zeropp.patching.apply.SITES", sites.SITES + (ghost, ))
    assert cli.main(["doctor"]) == 1
    out = capsys.readouterr().out
    assert "[PROBLEM] site AllGatherHandle.no_such_method: missing (not patched)" in out and "1 problem(s)" in out


def test_the_package_ships_no_benchmark_command():
    with pytest.raises(SystemExit):
        cli.main(["bench"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_kernel_benchmark_needs_a_gpu(tmp_path):
    """The script in benchmarks/, run as its README says, from another working directory: no file written."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_kernels.py"), "--out",
         str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "need a CUDA GPU" in proc.stdout and list(tmp_path.iterdir()) == []


def demo_results(upstream, patched_losses=(0.70, 0.69, 0.68)):
    """What the demo's two jobs return: the unpatched run's result, then the patched job's."""
    checked = {"forward_checks": 120, "dtype_errors": [], "value_errors": [], "counts": {"quantize": 4}}
    return iter([
        {
            "deepspeed": "0.19.8",
            "torch": "2.13.0",
            "runs": {
                "upstream": upstream
            }
        },
        {
            "deepspeed": "0.19.8",
            "torch": "2.13.0",
            "runs": {
                "baseline": dict(checked, losses=[0.70, 0.70, 0.70]),
                "patched": dict(checked, losses=list(patched_losses)),
            }
        },
    ])


def test_demo_says_what_it_shows(monkeypatch, capsys):
    jobs = demo_results({"error": "AssertionError: number of weights must be a multiple of 8"})
    monkeypatch.setattr(demo_command, "run_ranks", lambda *args, **kwargs: next(jobs))
    assert cli.main(["demo", "--device", "cpu", "--steps", "3"]) == 0
    out = capsys.readouterr().out
    assert "a stand-in for its fp16 op" in out  # the unpatched run on CPU does not run DeepSpeed's own op
    assert ("without the patch, DeepSpeed 0.19.8 stops with: AssertionError: number of "
            "weights must be a multiple of 8") in out
    assert "a difference that grows over the steps is expected; every step is within the bound" in out
    assert "with the patch, dtypes at every forward: all bf16, as created (120 parameter checks)" in out


def test_demo_says_when_a_loss_leaves_the_tests_bound(monkeypatch, capsys):
    jobs = demo_results({
        "losses": [0.7, 0.7, 0.7],
        "dtype_errors": ["w: torch.float16"],
        "value_errors": []
    },
                        patched_losses=(0.70, 0.69, 0.60))
    monkeypatch.setattr(demo_command, "run_ranks", lambda *args, **kwargs: next(jobs))
    cli.main(["demo", "--device", "cpu", "--steps", "3"])
    out = capsys.readouterr().out
    assert "NOT every step is within the bound" in out
    assert "without the patch, DeepSpeed 0.19.8 trains, but hands parameters back wrong: ['w: torch.float16']" in out


@pytest.mark.parametrize("env, argv, problem", [
    ({
        "DEEPSPEED_ZEROPP": "garbage"
    }, [], "DEEPSPEED_ZEROPP='garbage' is not understood"),
    ({
        "DEEPSPEED_ZEROPP_BACKEND": "bogus"
    }, [], "DEEPSPEED_ZEROPP_BACKEND='bogus' is not a backend"),
    ({}, ["--backend", "bogus"], "--backend 'bogus' is not a backend"),
    ({
        "DEEPSPEED_ZEROPP": "1"
    }, [], "deepspeed_zeropp.pth is in none of this interpreter's site-packages"),
])
def test_doctor_never_ok_for_a_setup_that_will_not_patch(monkeypatch, capsys, tmp_path, env, argv, problem):
    monkeypatch.setattr("deepspeed_zeropp.doctor._pth_locations", lambda: [str(tmp_path)])  # no .pth there
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert cli.main(["doctor", *argv]) == 1
    out = capsys.readouterr().out
    assert f"[PROBLEM] {problem}" in out and "everything needed is in place" not in out
    assert "unmodified scripts are patched" not in out


def test_doctor_runs_the_backend_asked_for(monkeypatch, capsys, tmp_path):
    (tmp_path / "deepspeed_zeropp.pth").write_text("")
    monkeypatch.setattr("deepspeed_zeropp.doctor._pth_locations", lambda: [str(tmp_path)])
    monkeypatch.setenv("DEEPSPEED_ZEROPP", "1")
    assert cli.main(["doctor", "--backend", "torch"]) == 0
    out = capsys.readouterr().out
    assert "round trip cpu float32 (backend torch, ran torch)" in out
    assert f"DEEPSPEED_ZEROPP=1: unmodified scripts are patched when they import DeepSpeed (deepspeed_zeropp.pth in {tmp_path})" in out
