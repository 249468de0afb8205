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
    assert "site CUDAQuantizer.quantize: patched" in out and "round trip cpu bfloat16: torch.bfloat16" in out
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
