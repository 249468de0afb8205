"""A harness job trains its runs one after another in the same processes: each finished run must leave nothing of
its engine alive (on a GPU, ~10 GB per rank per run of a 1B-parameter model), neither through DeepSpeed's
process-wide references nor through the patch."""
import importlib.metadata

import pytest
from packaging.version import Version

from harness.launch import run_job


@pytest.mark.skipif(Version(importlib.metadata.version("deepspeed")) < Version("0.18.4"),
                    reason="on DeepSpeed 0.14.4 a reference that the garbage collector cannot see (held outside "
                    "Python objects) keeps every engine's module and ZeRO-3 optimizer alive from construction on")
def test_finished_runs_leave_nothing_alive():
    """Stock DeepSpeed, then patched qwZ + qgZ (2 ranks as 2 nodes: both really quantize), both built under
    zero.Init with their config as users build for ZeRO++; each later run counts what is left of the earlier ones'
    engines (tests/harness_instruments.py, ``left_behind``). The last run stays patched, so what the patch itself
    might keep is not dropped by unpatching. (Stock qwZ fails on CPU before DeepSpeed 0.19.6, hence no ZeRO++ flag
    in the stock run: the references found are DeepSpeed's, with or without one.)"""
    runs = [
        {
            "name": "stock",
            "patch": False,
            "zero_init": "config"
        },
        {
            "name": "patched",
            "zero_init": "config",
            "quantized": True,
            "quantized_gradients": True
        },
        {
            "name": "next"
        },
    ]
    spec = {  # benchmarks/e2e.py's job, tiny: its GPT shape is one stock qwZ runs on
        "model": "gpt",
        "model_args": dict(layers=2, width=64, heads=2, seq=32, vocab=2048),
        "batch_size": 2,
        "dtype": "bf16",
        "patch": True,
        "checks": False,
        "steps": 2,
        "seed": 0,
        "runs": runs
    }
    spec["instruments"] = "tests.harness_instruments"  # left_behind
    result = run_job(spec, world_size=2, local_size=1, timeout=600)["runs"]
    errors = {k: run["traceback"] for k, run in result.items() if "error" in run}
    assert not errors, errors
    counts = result["patched"]["counts"]
    assert counts.get("quantized_bucket_gathers", 0) > 0 and counts.get("gradients_reduced_in_4_bits", 0) > 0
    assert [result[name]["left_behind"] for name in ("stock", "patched", "next")] == [{}, {}, {}]
