"""ZeRO++ qgZ (zero_quantized_gradients) with bf16/fp32 gradients on CPU ranks arranged as 2 "nodes".

qgZ only runs when world_size // device_count > 1; on DeepSpeed's CPU accelerator device_count is LOCAL_SIZE, so
2 ranks with LOCAL_SIZE=1 are 2 nodes of 1 rank, and 4 ranks with LOCAL_SIZE=2 are 2 nodes of 2.
"""
import pytest

from deepspeed_zeropp.training.launch import run_job
from tests.multirank.test_training import assert_trained_like_baseline

CASES = [["bf16", [64, 96]], ["fp32", [64, 96]], ["bf16", [7, 13]], ["fp32", [257]], ["bf16", [3, 1000]]]


@pytest.mark.parametrize("world_size,local_size", [(2, 1), (4, 2)], ids=["2x1", "2x2"])
def test_reduce_scatter_within_4bit_bound(world_size, local_size):
    """Each rank's partition against the exact mean of every rank's gradient (fp64). Each of the two 4-bit stages
    errs by at most one step (absmax/8) per contribution, which bounds the mean's error by 1/4 of the largest
    gradient value; typical errors are far below. Values beyond fp16's range stay finite."""
    runs = [{
        "name": "normal",
        "qgz_check": True,
        "cases": CASES
    }, {
        "name": "beyond_fp16",
        "qgz_check": True,
        "cases": [["bf16", [128, 128]], ["fp32", [4096]]],
        "scale": 1e6
    }]
    result = run_job({
        "model": "bert",
        "dtype": "bf16",
        "patch": True,
        "runs": runs
    },
                     world_size=world_size,
                     local_size=local_size,
                     timeout=600)
    for run in result["runs"].values():
        assert "error" not in run, run
        for case in run["cases"]:
            assert case["finite"] and case["numel"] == case["expected_numel"], case
            assert case["max_error_of_largest"] <= 0.25 and case["rms_error_of_rms"] <= 0.2, case
    names = {"bf16": "torch.bfloat16", "fp32": "torch.float32"}
    assert [c["dtype"] for c in result["runs"]["normal"]["cases"]] == [names[dtype] for dtype, _ in CASES]


def test_training_with_quantized_gradients_and_weights():
    """bf16 BERT with qgZ (and qwZ) on 2 nodes: loss close to the unquantized run, qgZ really called. 4-bit
    gradients (~13% RMS error per reduction) move AdamW's steps visibly, hence a wider band than qwZ's."""
    runs = [{"name": "baseline"}, {"name": "qgz", "quantized_gradients": True, "quantized": True}]
    spec = {"model": "bert", "dtype": "bf16", "patch": True, "steps": 5, "seed": 0, "runs": runs}
    result = run_job(spec, world_size=2, local_size=1, timeout=900)
    assert_trained_like_baseline(result, "qgz", "quantized_bucket_gathers", tolerance=lambda ref: 0.05 + 0.05 * ref)
    assert result["runs"]["qgz"]["counts"].get("quantized_gradient_reductions", 0) > 0
