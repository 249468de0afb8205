"""doctor and bench: what they print comes from checks they ran; problems give a non-zero exit."""
import pytest
import torch

import deepspeed_zeropp
from deepspeed_zeropp import cli
from deepspeed_zeropp.patching import sites


@pytest.fixture(autouse=True)
def unpatched_afterwards():
    yield
    deepspeed_zeropp.unpatch()


def test_doctor_all_good(capsys):
    assert cli.main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "site CUDAQuantizer.quantize: patched" in out
    assert "round trip cpu bfloat16 (backend auto, ran torch): torch.bfloat16" in out
    assert "everything needed is in place" in out


def test_doctor_leaves_deepspeed_as_it_found_it():
    from deepspeed.runtime.zero.partition_parameters import CUDAQuantizer
    before = CUDAQuantizer.__dict__["quantize"]
    cli.main(["doctor"])
    assert CUDAQuantizer.__dict__["quantize"] is before


def test_doctor_flags_a_missing_site(monkeypatch, capsys):
    ghost = sites.Site("AllGatherHandle", "no_such_method", lambda original: original, "test")
    monkeypatch.setattr("deepspeed_zeropp.patching.apply.SITES", sites.SITES + (ghost, ))
    assert cli.main(["doctor"]) == 1
    out = capsys.readouterr().out
    assert "[PROBLEM] site AllGatherHandle.no_such_method: missing (not patched)" in out and "1 problem(s)" in out


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_bench_needs_a_gpu(tmp_path, capsys):
    assert cli.main(["bench", "--out", str(tmp_path)]) == 2
    assert "need a CUDA GPU" in capsys.readouterr().out


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
