"""ZeRO-3 training on GPUs with the native kernels: 2 ranks sharing one GPU over gloo, and 2 GPUs over NCCL when
the machine has them. The same assertions as the CPU tier: dtype at every forward, gathered values equal to the
originals within the int8 bound, per-step loss close to the unquantized run, quantized gathers counted."""
import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

from deepspeed_zeropp._harness.launch import run_job  # noqa: E402
from tests.helpers import assert_trained_like_baseline  # noqa: E402

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
QGZ_CHECK = "benchmarks._qgz_instruments"  # the harness instrument that runs a qgZ reduction and measures it


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
