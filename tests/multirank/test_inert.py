"""Inert when off: with the patch applied and no ZeRO++ flag, ZeRO-3 training is bit for bit stock DeepSpeed's,
and none of our code that does work runs (only the seams' tests for whether there is any).

One job trains each configuration twice from the same seed, unpatched then patched, on a model whose partitions
are padded at 2 ranks: per-step losses and a digest of every final parameter must be equal."""
import pytest

from harness.launch import run_job

CONFIGS = {
    "bf16": {},
    "fp32": {
        "dtype": "fp32"
    },
    "offload_param_cpu": {
        "offload_param": "cpu"
    },
    "offload_optimizer_cpu": {
        "offload_optimizer": "cpu"
    },
}


def nvme_unavailable():
    """Why DeepSpeed's NVMe offload cannot run here, or None."""
    import deepspeed
    from deepspeed.accelerator import get_accelerator
    builder = get_accelerator().get_op_builder("AsyncIOBuilder")
    if builder is None or builder.__name__ == "NotImplementedBuilder":
        return f"DeepSpeed {deepspeed.__version__}'s {get_accelerator().device_name()} accelerator has no async_io op"
    if not builder().is_compatible(verbose=False):
        return "DeepSpeed's async_io op does not build here (libaio headers missing)"
    return None


@pytest.fixture(scope="module")
def inert(tmp_path_factory):
    configs = dict(CONFIGS)
    if nvme_unavailable() is None:
        configs["offload_param_nvme"] = {"offload_param": "nvme", "nvme_path": str(tmp_path_factory.mktemp("nvme"))}
    runs = []
    for name, config in configs.items():
        runs += [dict(config, name=f"stock_{name}", patch=False, digest=True), dict(config, name=name, digest=True)]
    spec = {"model": "padded", "dtype": "bf16", "patch": True, "steps": 3, "seed": 0, "runs": runs}
    spec["instruments"] = "tests.harness_instruments"  # digest, seam_work
    return run_job(spec, world_size=2, timeout=900)


@pytest.mark.parametrize("name", list(CONFIGS) + ["offload_param_nvme"])
def test_bit_identical_to_stock_and_no_work(inert, name):
    if name == "offload_param_nvme" and nvme_unavailable():
        pytest.skip(nvme_unavailable())
    errors = {k: run["traceback"] for k, run in inert["runs"].items() if "error" in run}
    assert not errors, errors  # a failed run ends the job
    stock, patched = inert["runs"][f"stock_{name}"], inert["runs"][name]
    assert len(patched["losses"]) == 3 and patched["losses"] == stock["losses"]
    assert patched["digest"] == stock["digest"] and patched["digest"]
    assert patched["seam_work"] == {} and patched["counts"] == {}, (patched["seam_work"], patched["counts"])
