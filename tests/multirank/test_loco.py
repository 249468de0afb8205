"""LoCo (``zeropp_loco_param``: qgZ with error feedback) training bf16 and fp32 BERT on 2 CPU "nodes" of 2 ranks.

DeepSpeed has LoCo from 0.16.2 to 0.19.7 (0.19.8 rejects the config key); on other releases these tests skip. With
4 ranks and LOCAL_SIZE=2 both qgZ stages run (node-local all-to-all, then across nodes), each with its error buffer.
"""
from importlib.metadata import version

import pytest
from packaging.version import Version

from deepspeed_zeropp.patching.sites import LOCO_SINCE, LOCO_UNTIL
from harness.launch import run_job

DEEPSPEED = Version(Version(version("deepspeed")).base_version)
pytestmark = pytest.mark.skipif(not Version(LOCO_SINCE) <= DEEPSPEED <= Version(LOCO_UNTIL),
                                reason=f"DeepSpeed {DEEPSPEED} has no LoCo (zeropp_loco_param exists in "
                                f"{LOCO_SINCE} to {LOCO_UNTIL})")

STEPS, RESET_T = 4, 2


def test_loco_trains_bf16_and_fp32_like_unquantized():
    """Per dtype: the unquantized run and the LoCo run from the same seed. The LoCo path really ran (DeepSpeed's
    stage 3 called all_to_all_loco_quant_reduce, 4-bit and unquantized tensors both reduced), every forward saw
    every parameter in its dtype, the per-step loss stays within qgZ's band of the unquantized loss (as
    tests/multirank/test_qgz.py), and rank 0's parameters hold fp32 error buffers that carry errors and were
    cleared after reset_T reductions (4 steps with reset_T = 2: cleared before step 3, so 2 uses)."""
    loco = {"err_beta": 0.8, "reset_T": RESET_T}
    runs = []
    for dtype in ("bf16", "fp32"):
        runs += [{
            "name": f"baseline_{dtype}",
            "dtype": dtype
        }, {
            "name": f"loco_{dtype}",
            "dtype": dtype,
            "quantized_gradients": True,
            "loco": loco
        }]
    spec = {"model": "bert", "dtype": "bf16", "patch": True, "steps": STEPS, "seed": 0, "runs": runs}
    spec["instruments"] = "tests.harness_instruments"  # error_buffers
    result = run_job(spec, world_size=4, local_size=2, timeout=900)
    for dtype in ("bf16", "fp32"):
        baseline, run = result["runs"][f"baseline_{dtype}"], result["runs"][f"loco_{dtype}"]
        assert "error" not in baseline and "error" not in run, run.get("traceback", run)
        assert run["forward_checks"] > 0 and run["dtype_errors"] == [] and run["value_errors"] == []
        counts = run["counts"]
        assert counts.get("loco_gradient_reductions", 0) > 0, counts
        assert counts.get("quantized_gradient_reductions", 0) == 0, counts
        assert counts.get("gradients_reduced_in_4_bits", 0) > 0 and counts.get("unquantized_gradient_batches", 0) > 0
        assert len(run["losses"]) == STEPS
        for step, (got, reference) in enumerate(zip(run["losses"], baseline["losses"])):
            assert abs(got - reference) <= 0.05 + 0.05 * reference, (dtype, step, run["losses"], baseline["losses"])
        buffers = run["error_buffers"]
        assert buffers["parameters"] > 0 and buffers["dtypes"] == ["torch.float32"], buffers
        assert buffers["uses"] == [(STEPS - 1) % RESET_T + 1] and buffers["nonzero"] > 0, buffers
