"""ZeRO++ qgZ (zero_quantized_gradients) with bf16/fp32 gradients on CPU ranks arranged as 2 "nodes".

qgZ only runs when world_size // device_count > 1; on DeepSpeed's CPU accelerator device_count is LOCAL_SIZE, so
2 ranks with LOCAL_SIZE=1 are 2 nodes of 1 rank, and 4 ranks with LOCAL_SIZE=2 are 2 nodes of 2.
"""
import pytest

from harness.launch import run_job
from tests.helpers import assert_buckets_alternated, assert_shared_all_to_alls_change_no_bit, assert_trained_like_baseline
from tests.qgz_sim import bound_of_largest

# (dtype, shape, quantized): as upstream, only tensors of >= 2 dimensions whose numel is a multiple of 2 x world
# (4 and 8 here) go in 4 bits; the others (1-D, 0-d, empty, 7 x 13) are reduced unquantized in fp32.
CASES = [["bf16", [64, 96], True], ["fp32", [64, 96], True], ["bf16", [7, 13], False], ["fp32", [257], False],
         ["bf16", [3, 1000], True], ["bf16", [5], False], ["fp32", [0, 8], False], ["fp32", [], False]]


@pytest.mark.parametrize("world_size,local_size", [(2, 1), (4, 2)], ids=["2x1", "2x2"])
def test_reduce_scatter_within_4bit_bound(world_size, local_size):
    """Each rank's partition against the exact mean of every rank's gradient (fp64), worst rank reported. 4-bit: each
    rounding errs by at most half a step (absmax / 14), which bounds the mean's error by 1/14 of the largest gradient
    value with one stage and 29/196 with two (tests/qgz_sim.py); typical errors are far below. Unquantized: the
    exact mean rounded once to the dtype, up to fp32 summation. Every rank gets its chunk of ceil(numel / world)
    values, fewer or none on the last ranks. Values beyond fp16's range stay finite."""
    runs = [{
        "name": "normal",
        "qgz_check": True,
        "cases": [case[:2] for case in CASES]
    }, {
        "name": "beyond_fp16",
        "qgz_check": True,
        "cases": [["bf16", [128, 128]], ["fp32", [4096]]],
        "scale": 1e6
    }]
    result = run_job(
        {
            "model": "bert",
            "dtype": "bf16",
            "patch": True,
            "runs": runs,
            "instruments": "harness.qgz_instruments"
        },
        world_size=world_size,
        local_size=local_size,
        timeout=600)
    bound = bound_of_largest(local_size) + 2**-8  # and the final rounding to bf16 or fp32
    for run in result["runs"].values():
        assert "error" not in run, run
        for case in run["cases"]:
            assert case["finite"] and case["numel"] == case["expected_numel"] and case["every_rank_numel_right"], case
            if case["quantized"]:
                assert case["max_error_of_largest"] <= bound and case["rms_error_of_rms"] <= 0.2, case
            else:
                assert case["error_of_rounded_mean"] <= 1e-6, case
    names = {"bf16": "torch.bfloat16", "fp32": "torch.float32"}
    cases = result["runs"]["normal"]["cases"]
    assert [(c["dtype"], c["quantized"]) for c in cases] == [(names[dtype], q) for dtype, _, q in CASES]
    assert [c["quantized"] for c in result["runs"]["beyond_fp16"]["cases"]] == [True, False]


@pytest.mark.parametrize("world_size,local_size", [(2, 1), (4, 2)], ids=["2x1", "2x2"])
@pytest.mark.parametrize("loco", [False, True], ids=["qgz", "loco"])
def test_shared_all_to_alls_change_no_bit(world_size, local_size, loco):
    """A call's 4-bit gradients share each stage's all-to-all, in batches of at most qgz.BATCH_BYTES: results (and
    LoCo's updated error buffers) bit for bit those of one call per gradient, with one batch, several, or one per
    gradient; and one all-to-all per batch and stage."""
    quantized = sum(q for _, _, q in CASES)
    assert_shared_all_to_alls_change_no_bit([case[:2] for case in CASES],
                                            loco, [1, 2, quantized],
                                            world_size=world_size,
                                            local_size=local_size,
                                            timeout=600)


def test_training_with_quantized_gradients_and_weights():
    """bf16 BERT with qgZ (and qwZ) on 2 nodes: loss close to the unquantized run, qgZ really called, with the
    weight matrices in 4 bits and the biases and norms (1-D) unquantized. 4-bit
    gradients (~13% RMS error per reduction) move AdamW's steps visibly, hence a wider band than qwZ's. The qgZ run
    has small gradient buckets and stand-in streams: DeepSpeed calls the two-stream seam where it reduces each
    bucket and in its epilogue, on every release the compatibility run covers (tests/helpers.py)."""
    qgz = {"name": "qgz", "quantized_gradients": True, "quantized": True}
    runs = [{"name": "baseline"}, dict(qgz, stand_in_streams=True, reduce_bucket_size=20000)]
    spec = {
        "model": "bert",
        "dtype": "bf16",
        "patch": True,
        "steps": 5,
        "seed": 0,
        "runs": runs,
        "instruments": "tests.bucket_instruments"
    }
    result = run_job(spec, world_size=2, local_size=1, timeout=900)
    assert_trained_like_baseline(result, "qgz", "quantized_bucket_gathers", tolerance=lambda ref: 0.05 + 0.05 * ref)
    counts = result["runs"]["qgz"]["counts"]
    assert counts.get("quantized_gradient_reductions", 0) > 0 and counts.get("gradients_reduced_in_4_bits", 0) > 0
    assert counts.get("unquantized_gradient_batches", 0) > 0, counts  # biases and norms
    assert_buckets_alternated(result["runs"]["qgz"], steps=5)
