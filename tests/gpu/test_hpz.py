"""hpZ (zero_hpz_partition_size 2) with quantized weights on 4 GPUs over NCCL, so the secondary partitions and their
quantized gathers run through the CUDA kernels. It needs 4 GPUs: NCCL refuses two ranks on one GPU, and DeepSpeed
cannot build hpZ's groups over gloo on CUDA devices (ProcessGroupGloo has no perform_nocolor_split). Loss parity and dtype at every forward against the unquantized hpZ run, and a checkpoint round trip:
identical partitions on every rank, next losses within the quantization tolerance (not bit for bit: a fresh engine
records DeepSpeed's module trace anew, so its backward gathers from the secondary partitions where the saved
engine's reuses the forward's gathers, and a secondary gather quantizes with other int8 scales)."""
import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

from harness.launch import run_job  # noqa: E402
from tests.helpers import assert_trained_like_baseline, loss_tolerance  # noqa: E402


@pytest.mark.skipif(torch.cuda.device_count() < 4, reason="needs 4 GPUs (hpZ 2 at 4 ranks over NCCL)")
def test_hpz_four_ranks_bf16_on_gpu():
    runs = [{
        "name": "baseline",
        "hpz": 2
    }, {
        "name": "qwz",
        "quantized": True,
        "hpz": 2
    }, {
        "name": "mixz",
        "quantized": True,
        "quantized_nontrainable": True,
        "hpz": 2
    }, {
        "name": "checkpoint",
        "quantized": True,
        "hpz": 2,
        "checkpoint": True,
        "next_steps": 3,
        "warm_up": True
    }]
    spec = {
        "model": "bert",
        "dtype": "bf16",
        "patch": True,
        "seed": 0,
        "steps": 4,
        "frozen": ["embeddings"],
        "runs": runs,
        "instruments": "tests.harness_instruments"  # checkpoint
    }
    result = run_job(spec, world_size=4, timeout=900, device="cuda")
    assert_trained_like_baseline(result, "qwz", "quantized_bucket_gathers", steps=4)
    assert_trained_like_baseline(result, "mixz", "quantized_bucket_gathers", steps=4)
    run = result["runs"]["checkpoint"]
    assert "error" not in run, run.get("traceback", run.get("error"))
    restored = run["checkpoint"]
    assert restored["compared"] > 0 and restored["mismatched"] == [], restored
    for loaded, saved in zip(restored["next_losses_loaded"], restored["next_losses_saved"]):
        assert abs(loaded - saved) <= loss_tolerance(saved), restored
