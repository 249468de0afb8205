"""MixZ++ (zero_quantized_nontrainable_weights) and the neighbouring upstream defects, in real ZeRO-3 training.

Frozen weights are compared with their originals (captured before DeepSpeed touched them) at every forward:
garbage cannot hide behind a loss. Each defect fix also has a run with its site left unpatched, which must fail.
"""
import pytest

from deepspeed_zeropp.formats.grouping import group_layout
from harness.launch import run_job
from tests.helpers import FROZEN, assert_clean, assert_trained_like_baseline, has_sequential_flag


def job(runs, model="bert", dtype="bf16", world_size=2, frozen=FROZEN, steps=3):
    spec = {"model": model, "dtype": dtype, "patch": True, "steps": steps, "seed": 0, "frozen": frozen, "runs": runs}
    spec["instruments"] = "tests.harness_instruments"  # gathered_check
    return run_job(spec, world_size=world_size, timeout=900)


@pytest.fixture(scope="module")
def frozen_bert():
    runs = [{
        "name": "baseline"
    }, {
        "name": "mixz",
        "quantized_nontrainable": True,
        "gathered_check": True
    }, {
        "name": "mixz_qwz",
        "quantized_nontrainable": True,
        "quantized": True
    }]
    if has_sequential_flag():
        runs.append({"name": "mixz_sequential", "quantized_nontrainable": True, "sequential": True})
    runs.append({
        "name": "without_partition_fix",
        "quantized_nontrainable": True,
        "exclude_sites": ["Init._partition_param"]
    })
    runs.append({  # last: it raises, which ends the job
        "name": "without_bucket_fix",
        "quantized_nontrainable": True,
        "exclude_sites": ["AllGatherCoalescedHandle.wait"]
    })
    return job(runs, steps=3)


@pytest.mark.parametrize("name", ["mixz", "mixz_qwz", "mixz_sequential"])
def test_frozen_bf16_weights_are_the_originals(frozen_bert, name):
    if name not in frozen_bert["runs"]:
        pytest.skip("this DeepSpeed has no stage3_allgather_sequential")
    kind = "quantized_single_gathers" if name == "mixz_sequential" else "quantized_bucket_gathers"
    assert_trained_like_baseline(frozen_bert, name, kind, steps=3, quantize_calls=name == "mixz_qwz")


def test_gathered_parameters_dequantizes_frozen_partition(frozen_bert):
    """Init's synchronous gather (GatheredParameters): before 0.18.5 its quantized branch never fires."""
    assert_clean(frozen_bert["runs"]["mixz"])


def test_partition_fix_is_needed(frozen_bert):
    """Without the _partition_param seam, frozen weights are quantized before they exist."""
    run = frozen_bert["runs"]["without_partition_fix"]
    assert "error" in run or run["value_errors"], run


def test_bucket_fix_is_needed(frozen_bert):
    """The bucket layout: unpatched, a coalesced MixZ++ bucket is dequantized as if every partition had
    the same group size, and from 0.17.2 each slice is cast to int8."""
    run = frozen_bert["runs"]["without_bucket_fix"]
    assert "error" in run or run["value_errors"] or run["dtype_errors"], run


def test_padded_and_prime_partitions_sequential_and_coalesced():
    """Any partition size: odd-sized parameters (131 x 131, 3 x 131, 3) at 2 ranks have padded partitions. Upstream
    leaves that padding uninitialised (qwZ then quantizes it with real values) and, in the sequential gather,
    maps scales to the wrong elements. The 131 x 131 partitions hold 8581 elements, a prime: quantized
    in groups with a shorter last one, per rank, through the single-parameter gather (sequential), the bucket gather
    (weight and frozen gate together), MixZ++'s bucket of stored partitions and Init's gather (GatheredParameters)."""
    assert not group_layout(8581).covers_exactly(8581)
    runs = [{
        "name": "baseline"
    }, {
        "name": "qwz",
        "quantized": True
    }, {
        "name": "mixz",
        "quantized_nontrainable": True,
        "gathered_check": True
    }]
    if has_sequential_flag():
        runs += [{
            "name": "qwz_sequential",
            "quantized": True,
            "sequential": True
        }, {
            "name": "mixz_sequential",
            "quantized_nontrainable": True,
            "quantized": True,
            "sequential": True
        }]
    runs.append({
        "name": "without_padding_fix",
        "quantized": True,
        "exclude_sites": ["Init._partition_param", "DeepSpeedZeRoOffload._convert_to_zero_parameters"]
    })
    if has_sequential_flag():  # last: it raises, which ends the job
        runs.append({
            "name": "without_sequential_fix",
            "quantized": True,
            "sequential": True,
            "exclude_sites": ["AllGatherHandle.wait"]
        })
    result = job(runs, model="mixed", dtype="fp32", frozen=[], steps=3)
    assert_trained_like_baseline(result, "qwz", "quantized_bucket_gathers", steps=3)
    assert_trained_like_baseline(result, "mixz", "quantized_bucket_gathers", steps=3, quantize_calls=False)
    if has_sequential_flag():
        assert_trained_like_baseline(result, "qwz_sequential", "quantized_single_gathers", steps=3)
        assert_trained_like_baseline(result, "mixz_sequential", "quantized_single_gathers", steps=3)
        unfixed = result["runs"]["without_sequential_fix"]
        assert "error" in unfixed or unfixed["value_errors"] or unfixed["dtype_errors"], unfixed
    assert result["runs"]["without_padding_fix"]["value_errors"]


def test_single_rank_mixz_and_zero_init_without_config():
    """Init.quantizer_module is read from the class (NoGather handles at partition world size 1,
    and a model built under zero.Init() without a config); upstream never sets it there."""
    runs = [{
        "name": "single_rank",
        "quantized_nontrainable": True
    }, {
        "name": "without_class_quantizer",
        "quantized_nontrainable": True,
        "exclude_sites": ["Init.quantizer_module"]
    }]
    result = job(runs, world_size=1, steps=2)
    assert_clean(result["runs"]["single_rank"])
    assert "AttributeError" in result["runs"]["without_class_quantizer"].get("error", ""), result["runs"]
    zero_init = job([{
        "name": "zero_init",
        "quantized": True,
        "zero_init": True
    }],
                    model="mixed",
                    dtype="fp32",
                    frozen=[],
                    steps=2)
    assert_clean(zero_init["runs"]["zero_init"])


def test_freezing_after_init_then_quantize_nontrainable_params():
    """Upstream quantize_nontrainable_params asserts fp16; in bf16 it now quantizes."""
    runs = [{
        "name": "lora_flow",
        "quantized_nontrainable": True,
        "freeze_after_init": ["word_embeddings"]
    }, {
        "name": "without_fix",
        "quantized_nontrainable": True,
        "freeze_after_init": ["word_embeddings"],
        "exclude_sites": ["DeepSpeedZeroOptimizer_Stage3.quantize_nontrainable_params"]
    }]
    result = job(runs, frozen=[], steps=2)
    assert_clean(result["runs"]["lora_flow"])
    assert "expects tensor.dtype == torch.float16" in result["runs"]["without_fix"].get("error", "")
