"""ZeRO-3 training on GPUs with the native kernels: 2 ranks sharing one GPU over gloo, and 2 GPUs over NCCL when
the machine has them. The same assertions as the CPU tier: dtype at every forward, gathered values equal to the
originals within the int8 bound, per-step loss close to the unquantized run, quantized gathers counted."""
import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

from harness.launch import run_job  # noqa: E402
from tests.helpers import assert_persistent_gathered_once  # noqa: E402
from tests.helpers import assert_shared_all_to_alls_change_no_bit, assert_trained_like_baseline  # noqa: E402

RUNS = [{
    "name": "baseline"
}, {
    "name": "qwz",
    "quantized": True
}, {
    "name": "mixz",
    "quantized_nontrainable": True,
    "quantized": True
}]
SPEC = {
    "model": "bert",
    "dtype": "bf16",
    "patch": True,
    "steps": 10,
    "seed": 0,
    "frozen": ["embeddings"],
    "runs": RUNS
}

DEVICES = [
    "cuda-shared",
    pytest.param("cuda", marks=pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs for NCCL"))
]


@pytest.mark.parametrize("device", DEVICES)
def test_bert_bf16_qwz_and_mixz(device):
    result = run_job(SPEC, world_size=2, timeout=600, device=device)
    assert_trained_like_baseline(result, "qwz", "quantized_bucket_gathers", steps=10)
    assert_trained_like_baseline(result, "mixz", "quantized_bucket_gathers", steps=10)


CASES = [["bf16", [64, 96]], ["fp32", [64, 96]], ["fp16", [64, 96]]]
QGZ_CHECK = "harness.qgz_instruments"  # the harness instrument that runs a qgZ reduction and measures it
# Where qgZ runs with the CUDA codec: every rank sees one GPU, so DeepSpeed counts each rank as a node. Sharing GPU 0
# goes over gloo (any machine with a GPU), one GPU per rank over NCCL.
QGZ_DEVICES = [
    "cuda-shared",
    pytest.param("cuda-isolated",
                 marks=pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs for NCCL"))
]
# (dtype, shape, quantized): the 4-bit path and the unquantized one (1-D, odd-sized, 0-d), one reduction each.
MIXED_CASES = [["bf16", [64, 96], True], ["fp32", [257], False], ["fp16", [3, 1000], True], ["bf16", [7, 13], False],
               ["fp16", [5], False], ["fp32", [], False]]


@pytest.mark.parametrize("device", QGZ_DEVICES)
def test_qgz_reduce_scatter_on_gpus_as_two_nodes(device):
    """The CUDA codec and the unquantized fp32 path, one reduction per case: every rank's partition within the
    4-bit bound of the exact mean (one stage: 1/14 of the largest value, plus the final rounding), unquantized ones
    the exact mean rounded once; each in its own dtype, every rank with its chunk."""
    result = run_job(
        {
            "model": "bert",
            "dtype": "bf16",
            "patch": True,
            "runs": [{
                "name": "mixed",
                "qgz_check": True,
                "cases": [case[:2] for case in MIXED_CASES]
            }],
            "instruments": QGZ_CHECK
        },
        device=device)
    cases = result["runs"]["mixed"]["cases"]
    assert [c["quantized"] for c in cases] == [quantized for _, _, quantized in MIXED_CASES]
    for case in cases:
        assert case["finite"] and case["numel"] == case["expected_numel"] and case["every_rank_numel_right"], case
        if case["quantized"]:
            assert case["max_error_of_largest"] <= 1 / 14 + 2**-8 and case["rms_error_of_rms"] <= 0.2, case
        else:
            assert case["error_of_rounded_mean"] <= 1e-6, case


@pytest.mark.parametrize("device", QGZ_DEVICES)
def test_shared_all_to_alls_change_no_bit_on_gpus(device):
    """The CUDA codec with LoCo's feedback: a call's 4-bit gradients sharing each all-to-all, in one batch, two, or
    one per gradient, give the results and error buffers of one call per gradient, bit for bit."""
    assert_shared_all_to_alls_change_no_bit([case[:2] for case in MIXED_CASES], True, [1, 1, 2], device=device)


@pytest.mark.parametrize("device", QGZ_DEVICES)
def test_bert_bf16_training_with_qgz(device):
    """qgZ and qwZ training on GPUs as 2 nodes: dtype at every forward, loss close to the unquantized run (4-bit
    gradients: the CPU tier's band), weight matrices reduced in 4 bits, biases and norms unquantized."""
    runs = [{"name": "baseline"}, {"name": "qgz", "quantized_gradients": True, "quantized": True}]
    spec = {"model": "bert", "dtype": "bf16", "patch": True, "steps": 5, "seed": 0, "runs": runs}
    result = run_job(spec, world_size=2, timeout=600, device=device)
    assert_trained_like_baseline(result,
                                 "qgz",
                                 "quantized_bucket_gathers",
                                 steps=5,
                                 tolerance=lambda ref: 0.05 + 0.05 * ref)
    counts = result["runs"]["qgz"]["counts"]
    assert counts.get("gradients_reduced_in_4_bits", 0) > 0 and counts.get("unquantized_gradient_batches", 0) > 0


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs for NCCL")
def test_qgz_on_two_gpus_as_two_nodes():
    """Each rank sees only its own GPU, so DeepSpeed counts 2 nodes and runs qgZ. Patched: every dtype within the
    4-bit bound. Unpatched (DeepSpeed's kernels): bf16 and fp32 gradients are read as fp16 bits; fp16 is fine."""
    runs = [{"name": "patched", "qgz_check": True, "cases": CASES}]
    patched = run_job({
        "model": "bert",
        "dtype": "bf16",
        "patch": True,
        "runs": runs,
        "instruments": QGZ_CHECK
    },
                      device="cuda-isolated")
    for case in patched["runs"]["patched"]["cases"]:
        assert case["finite"] and case["max_error_of_largest"] <= 0.25 and case["rms_error_of_rms"] <= 0.2, case
    # fp16 first, as the control; a crash on bf16 (instead of silent corruption) also ends the job there.
    runs = [{"name": dtype, "qgz_check": True, "cases": [[dtype, shape]]} for dtype, shape in CASES[::-1]]
    upstream = run_job({
        "model": "bert",
        "dtype": "bf16",
        "patch": False,
        "runs": runs,
        "instruments": QGZ_CHECK
    },
                       device="cuda-isolated")
    (fp16, ) = upstream["runs"]["fp16"]["cases"]
    assert fp16["finite"] and fp16["rms_error_of_rms"] <= 0.2, fp16
    for dtype in ("bf16", "fp32"):
        run = upstream["runs"].get(dtype, {"error": "not reached: an earlier case crashed"})
        corrupted = "error" in run or not run["cases"][0]["finite"] or run["cases"][0]["rms_error_of_rms"] > 0.5
        assert corrupted, (dtype, run)


def _fetch_job(runs, **spec):
    spec = dict(spec,
                patch=True,
                seed=0,
                runs=runs,
                instruments=["tests.fetch_instruments", "tests.harness_instruments"])
    return run_job(spec, world_size=2, timeout=600, device="cuda-shared")


def test_persistent_parameters_in_one_all_gather():
    """The persistent parameters' gather after each step with CUDA tensors (2 ranks on GPU 0 over gloo): one
    all-gather per dtype, training like the stock per-parameter gather (GPU arithmetic is not bit-reproducible from
    run to run: within the loss tolerance) and like unquantized."""
    assert_persistent_gathered_once(_fetch_job, "bert", "bf16", 1100, bitwise=False)
