"""Real ZeRO-3 training over gloo on CPU (2 ranks, the installed DeepSpeed) with zero_quantized_weights.

Each job trains an unquantized baseline and the quantized variants from the same seed in the same process
group. Every test asserts the dtype of every parameter at every forward, gathered values equal to the
originals within the int8 bound before they are trained, per-step loss close to the baseline, and counters
showing that quantized all-gathers really ran (at world size 1 nothing is ever quantized).
"""
import pytest
from packaging.version import Version

from harness.launch import run_job
from tests.helpers import STEPS, assert_persistent_gathered_once, assert_trained_like_baseline, has_sequential_flag

WORLD = 2


def job(model, dtype, runs, patch=True, **extra):
    spec = {"model": model, "dtype": dtype, "patch": patch, "steps": STEPS, "seed": 0, "runs": runs, **extra}
    return run_job(spec, world_size=WORLD, timeout=900)


def ds_version():
    import importlib.metadata
    return Version(Version(importlib.metadata.version("deepspeed")).base_version)


@pytest.fixture(scope="module")
def bert_bf16():
    runs = [{"name": "baseline"}, {"name": "coalesced", "quantized": True}]
    if has_sequential_flag():
        runs.append({"name": "sequential", "quantized": True, "sequential": True})
    return job("bert", "bf16", runs)


def test_bert_bf16_coalesced_issue_7775(bert_bf16):
    """(a) The #7775 shape: BertForSequenceClassification, bf16, AdamW, zero_quantized_weights."""
    assert_trained_like_baseline(bert_bf16, "coalesced", "quantized_bucket_gathers")


def test_bert_bf16_sequential(bert_bf16):
    """(c) Single-parameter gathers: stage3_allgather_sequential where the release has it; BERT's one-parameter
    modules (embeddings) take the same AllGatherHandle path on every release."""
    name = "sequential" if has_sequential_flag() else "coalesced"
    assert_trained_like_baseline(bert_bf16, name, "quantized_single_gathers")
    if name == "sequential":
        assert bert_bf16["runs"][name]["counts"].get("quantized_bucket_gathers", 0) == 0


def test_bert_fp32():
    """(b) The same model and optimizer in fp32."""
    result = job("bert", "fp32", [{"name": "baseline"}, {"name": "coalesced", "quantized": True}])
    assert_trained_like_baseline(result, "coalesced", "quantized_bucket_gathers")


def test_bucket_mixing_bf16_and_fp32():
    """(d) One module with an fp32 and a bf16 parameter: one quantized bucket of two dtypes."""
    result = job("mixed", "fp32", [{"name": "baseline"}, {"name": "mixed", "quantized": True}])
    assert_trained_like_baseline(result, "mixed", "quantized_bucket_gathers")


def test_unpatched_reproduces_upstream_failure():
    """Without the patch (and DeepSpeed's op emulated faithfully on CPU) the #7775 run fails as upstream does.
    Before 0.19.6 whichever comes first of the dtype error and the multiple-of-8 assertion on BERT's 257-element
    partition (the order of gathers differs between releases); from 0.19.6 that assertion."""
    result = job("bert", "bf16", [{"name": "quantized", "quantized": True}], patch=False)
    error = result["runs"]["quantized"].get("error", "")
    multiple_of_8 = "multiple of 8" in error and "257" in error
    if ds_version() < Version("0.19.6"):
        assert multiple_of_8 or error.startswith("RuntimeError") and ("Half" in error or "dtype" in error), error
    else:
        assert multiple_of_8, error


def test_bert_bf16_persistent_parameters_in_one_all_gather():
    """BERT's persistent parameters (biases and layer norms, 46 at a threshold of 1100 elements), gathered again
    after every step through Init's coalesced gather: one all-gather with the patch, one per parameter with its
    seam left out, bit for bit the same training, on every release."""

    def fetch_job(runs, model, dtype, steps):
        return job(model,
                   dtype,
                   runs,
                   steps=steps,
                   instruments=["tests.fetch_instruments", "tests.harness_instruments"])

    assert_persistent_gathered_once(fetch_job, "bert", "bf16", 1100)
