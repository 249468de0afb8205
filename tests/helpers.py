"""What several test modules share: assertions on harness results, dtype tables (the stand-in for DeepSpeed's op
is deepspeed_zeropp.demo.upstream_op's)."""
import pytest
import torch

from deepspeed_zeropp.formats.dtypes import BY_NAME as DTYPES  # noqa: F401  (the tests' dtype table)

STEPS = 5  # training steps of a harness job unless a test says otherwise
FROZEN = ["embeddings", "attention"]  # a LoRA-like split of BERT: frozen embeddings and attention, trainable FFNs


def loss_tolerance(baseline):
    return 0.02 + 0.02 * abs(baseline)


def has_sequential_flag():
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig
    fields = getattr(DeepSpeedZeroConfig, "model_fields", None) or DeepSpeedZeroConfig.__fields__  # pydantic 2 / 1
    return "allgather_sequential" in fields


def assert_clean(run):
    assert "error" not in run, run.get("traceback", run.get("error"))
    assert run["forward_checks"] > 0 and run["dtype_errors"] == [] and run["value_errors"] == []


def assert_trained_like_baseline(result,
                                 name,
                                 gather_kind,
                                 steps=STEPS,
                                 quantize_calls=True,
                                 tolerance=loss_tolerance):
    """``quantize_calls``: qwZ quantizes at every gather; MixZ++ alone quantized its partitions at start-up."""
    baseline, run = result["runs"]["baseline"], result["runs"][name]
    assert "error" not in run, run.get("traceback", run.get("error"))
    assert run["forward_checks"] > 0 and run["dtype_errors"] == []
    assert run["value_errors"] == []
    assert run["counts"].get("dequantize", 0) > 0 and (run["counts"].get("quantize", 0) > 0 or not quantize_calls)
    assert run["counts"].get(gather_kind, 0) > 0, run["counts"]
    assert len(run["losses"]) == steps
    for step, (quantized, reference) in enumerate(zip(run["losses"], baseline["losses"])):
        assert abs(quantized - reference) <= tolerance(reference), (step, run["losses"], baseline["losses"])


def assert_shared_all_to_alls_change_no_bit(cases, loco, batches, **job):
    """Runs harness/qgz_instruments.qgz_batches on ``cases`` ([dtype name, shape] pairs) with ``run_job``'s
    ``job`` arguments: every batch limit's 4-bit results (and LoCo's error buffers) bit for bit those of one call
    per gradient, ``batches`` the batch counts of the default, two-largest and one-byte limits, and one all-to-all
    per batch and stage."""
    from harness.launch import run_job
    spec = {"model": "bert", "dtype": "bf16", "patch": True, "instruments": "harness.qgz_instruments"}
    result = run_job(dict(spec, runs=[{"name": "batches", "qgz_batches": cases, "loco": loco}]), **job)
    run = result["runs"]["batches"]
    assert "error" not in run, run
    variants = run["variants"]
    assert [variants[name]["batches"] for name in ("default", "two_largest", "one")] == batches, variants
    for variant in variants.values():
        assert variant["mismatches"] == 0 and variant["all_to_alls"] == variant["batches"] * run["stages"], variants


def assert_bitwise(actual, expected):
    """Equal bit patterns, with any NaN matching any NaN (the wire format only promises 'NaN')."""
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    actual, expected = actual.cpu(), expected.cpu()
    nan = torch.isnan(actual) if actual.is_floating_point() else torch.zeros_like(actual, dtype=torch.bool)
    assert torch.equal(nan, torch.isnan(expected) if expected.is_floating_point() else nan)
    int_type = {1: torch.int8, 2: torch.int16, 4: torch.int32}[actual.element_size()]
    mismatch = (actual.view(int_type) != expected.view(int_type)) & ~nan
    assert not mismatch.any(), f"{int(mismatch.sum())} of {actual.numel()} differ, first at {mismatch.nonzero()[0]}"


@pytest.fixture(scope="module", autouse=True)
def extension_builds():
    """For the CUDA kernel tests (imported there): CUDA is here, so a build failure is a defect of this package,
    not a reason to skip."""
    from deepspeed_zeropp.backends import cuda as cuda_backend
    assert cuda_backend.load_error() is None


def assert_persistent_gathered_once(job, model, dtype, threshold, steps=3, bitwise=True, **options):
    """``job(runs, model=, dtype=, steps=, **options)`` trains ``model`` with persistent parameters (at most
    ``threshold`` elements): unquantized, ours, and ours with Init's coalesced gather left to DeepSpeed. Ours
    trains like unquantized and (``bitwise``: where the training's arithmetic is deterministic, as on the CPU) bit
    for bit like the stock gather, and issues one all-gather per dtype of the persistent parameters after each step
    where the stock gather issues one per parameter (the runs' instruments must include tests.fetch_instruments)."""
    from deepspeed_zeropp.patching.sites import INIT_COALESCED_SITE
    runs = [{"name": "baseline", "persistence_threshold": threshold}]
    runs += [{"name": "ours", "quantized": True, "persistence_threshold": threshold, "digest": True}]
    runs += [dict(runs[-1], name="stock", exclude_sites=[INIT_COALESCED_SITE])]
    result = job(runs, model=model, dtype=dtype, steps=steps, **options)
    ours, stock = result["runs"]["ours"], result["runs"]["stock"]
    assert_trained_like_baseline(result, "ours", "quantized_bucket_gathers", steps=steps)
    if bitwise:
        assert ours["losses"] == stock["losses"] and ours["digest"] == stock["digest"]
    else:
        assert_trained_like_baseline(dict(result, runs=dict(result["runs"], baseline=stock)),
                                     "ours",
                                     "quantized_bucket_gathers",
                                     steps=steps)
    persistent = ours["persistent"]
    assert persistent["params"] > persistent["dtypes"] >= 1, persistent
    saved = steps * (persistent["params"] - persistent["dtypes"])
    assert ours["collectives"]["all_gathers"] == stock["collectives"]["all_gathers"] - saved, (ours, stock)


def assert_buckets_alternated(run, steps):
    """A run with ``stand_in_streams`` (tests/bucket_instruments.py) and qgZ: one report of qgZ's last read per bucket
    it reduced, more buckets than steps; each next bucket's stream waits on the report recorded on the other stream;
    DeepSpeed's stream waits for the other one before every epilogue and is the reduce stream at every step's start
    (patching/seams/buckets.py)."""
    import re
    log = run["stream_log"]
    assert run["stream_at_step_start"] == ["own"] * steps, log
    reads = [line for line in log if re.fullmatch(r"read\d+ on (own|spare)", line)]
    assert len(reads) == run["counts"]["quantized_gradient_reductions"] > steps, log
    moves = 0
    for i, line in enumerate(log):
        waiter, _, waited = line.partition(" waits ")
        if waited.startswith("read"):
            recorded = next(r for r in reversed(log[:i]) if r.startswith(waited + " on "))
            assert recorded.split(" on ")[1] != waiter, log
            moves += 1
    assert moves > 0 and log.count("own waits spare") == steps, log
