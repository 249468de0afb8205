"""One all-gather per quantized fetch (over gloo, the installed DeepSpeed): the codes and scales of a quantized bucket,
single parameter or hpZ secondary fetch travel as one packet per rank (patching/seams/gathers.py, the wire layout in
docs/numerics.md). Each job trains the same model from the same seed with packets (``packed``) and with the fetch
seam left out (``split``: DeepSpeed's two all-gathers, codes then scales): training is bit for bit the same (the
torch backend's arithmetic is deterministic), every quantized fetch sends one packet, and a step issues no more
all-gathers than the unquantized run's."""
import pytest

from deepspeed_zeropp.patching.seams import fetch
from deepspeed_zeropp.patching.sites import STEP_SITE
from harness.launch import run_job
from tests.helpers import (STEPS, assert_persistent_gathered_once, assert_trained_like_baseline, has_sequential_flag,
                           loss_tolerance)

SPLIT = ["partition_parameters._dist_allgather_fn"]
INSTRUMENTS = ["tests.fetch_instruments", "tests.harness_instruments"]  # see fetch_instruments


def job(runs, model="bert", dtype="bf16", world_size=2, **extra):
    spec = {
        "model": model,
        "dtype": dtype,
        "patch": True,
        "steps": STEPS,
        "seed": 0,
        "runs": runs,
        "instruments": INSTRUMENTS,
        **extra
    }
    return run_job(spec, world_size=world_size, timeout=900)


def pair(name, **run):
    """The packed run and its split twin."""
    return [dict(run, name=name, digest=True), dict(run, name=f"{name}_split", digest=True, exclude_sites=SPLIT)]


def in_place(name, **run):
    """A run that writes each parameter's part of its buckets' packets in place (``parts_in_place``)."""
    return dict(run, name=f"{name}_in_place", digest=True, parts_in_place=True)


def assert_in_place_like_packed(result, name):
    """Parts written in place (the torch backend's dequantize_parts_into): bit for bit the same training."""
    runs = result["runs"]
    packed, written = runs[name], runs[f"{name}_in_place"]
    assert "error" not in written, written.get("traceback")
    assert written["packets"].get("parts_in_place", 0) > 0 and "parts_in_place" not in packed["packets"]
    assert written["losses"] == packed["losses"] and written["digest"] == packed["digest"]


def assert_packed_like_split(result, name, gather_kind):
    runs = result["runs"]
    packed, split = runs[name], runs[f"{name}_split"]
    assert_trained_like_baseline(result, name, gather_kind)
    assert_trained_like_baseline(result, f"{name}_split", gather_kind)
    assert packed["losses"] == split["losses"]
    assert packed["digest"] == split["digest"]
    # every quantized fetch sent one packet and no codes on their own; the split twin sent none
    assert packed["packets"].get("packet_all_gathers", 0) > 0 and packed["collectives"].get("int8", 0) == 0
    assert packed["collectives"]["uint8"] == packed["packets"]["packet_all_gathers"]
    assert split["packets"].get("packet_all_gathers", 0) == 0 and split["collectives"].get("int8", 0) > 0
    assert split["collectives"]["all_gathers"] == packed["collectives"]["all_gathers"] + split["collectives"]["int8"]


@pytest.fixture(scope="module")
def bert_bf16():
    runs = [{"name": "baseline", "fetch_cost": True}] + pair("coalesced", quantized=True, fetch_cost=True)
    runs += [in_place("coalesced", quantized=True)]
    if has_sequential_flag():
        runs += [{"name": "baseline_sequential", "sequential": True}]
        runs += pair("sequential", quantized=True, sequential=True)
    return job(runs)


def test_bucket_fetches_send_one_packet(bert_bf16):
    """BERT bf16 (partitions of 257 elements: padded, in groups with a short last one): bit for bit the split
    run, and the run whose waits write each parameter's parts in place; one all-gather per quantized fetch, as many
    all-gathers per step as unquantized."""
    assert_packed_like_split(bert_bf16, "coalesced", "quantized_bucket_gathers")
    assert_in_place_like_packed(bert_bf16, "coalesced")
    runs = bert_bf16["runs"]
    assert runs["coalesced"]["collectives"]["all_gathers"] == runs["baseline"]["collectives"]["all_gathers"]


def test_single_parameter_fetches_send_one_packet(bert_bf16):
    if not has_sequential_flag():
        pytest.skip("this DeepSpeed has no stage3_allgather_sequential")
    assert_packed_like_split(bert_bf16, "sequential", "quantized_single_gathers")
    runs = bert_bf16["runs"]
    unquantized = runs["baseline_sequential"]["collectives"]["all_gathers"]
    assert runs["sequential"]["collectives"]["all_gathers"] == unquantized


def test_fetch_cost(bert_bf16):
    """One fetch, counted: one all-gather (of bytes) where the split fetch has two, and at most as many kernel
    operations as the split fetch."""
    runs = bert_bf16["runs"]
    for kind in ("bucket", "single"):
        baseline, packed, split = (runs[name]["fetch_cost"][kind]
                                   for name in ("baseline", "coalesced", "coalesced_split"))
        assert baseline["all_gathers"] == packed["all_gathers"] == 1 and packed["sent"] == ["torch.uint8"], runs
        assert split["all_gathers"] == 2 and split["sent"] == ["torch.int8", "torch.float32"], runs
        assert packed["kernels"] <= split["kernels"], (packed, split)


def test_mixed_dtype_bucket():
    """A bucket of an fp32 and a bf16 parameter: one packet, where unquantized ZeRO-3 sends one all-gather per
    dtype."""
    runs = [{"name": "baseline"}] + pair("mixed", quantized=True) + [in_place("mixed", quantized=True)]
    result = job(runs, model="mixed", dtype="fp32")
    assert_packed_like_split(result, "mixed", "quantized_bucket_gathers")
    assert_in_place_like_packed(result, "mixed")
    runs = result["runs"]
    assert runs["mixed"]["collectives"]["all_gathers"] <= runs["baseline"]["collectives"]["all_gathers"]


def test_mixz_trainable_fetches_send_one_packet():
    """MixZ++ with qwZ on a partly frozen BERT: the trainable weights' fetches send packets; the frozen weights'
    stored codes keep their two all-gathers (the closures concatenate or alias them, out of the quantizer's reach),
    with the same values either way."""
    runs = [{"name": "baseline"}] + pair("mixz_qwz", quantized=True, quantized_nontrainable=True)
    result = job(runs, frozen=["embeddings", "attention"], steps=3)
    runs = result["runs"]
    packed, split = runs["mixz_qwz"], runs["mixz_qwz_split"]
    assert packed["losses"] == split["losses"] and packed["digest"] == split["digest"]
    assert packed["packets"].get("packet_all_gathers", 0) > 0
    assert packed["collectives"]["all_gathers"] < split["collectives"]["all_gathers"]


STEP_SEAM = [STEP_SITE]


def test_hpz_secondary_fetches_send_one_packet():
    """zero_hpz_partition_size 2 at 4 ranks: the secondary-partition fetches (inside each hpZ group) send packets,
    bit for bit the split run and the run that writes the parts in place. Inside each optimizer step no secondary
    partition is written (one per persistent parameter a step with the step's seam left out), bit for bit the same
    training; where a step skips its update (as on an overflow), the same training up to that step and within the
    loss tolerance after it (the next forward reads the primary partitions)."""
    runs = [{"name": "baseline", "hpz": 2}] + pair("hpz", quantized=True, hpz=2)
    runs += [in_place("hpz", quantized=True, hpz=2)]
    persistent = dict(quantized=True, hpz=2, digest=True, persistence_threshold=1100)  # BERT's biases and norms
    runs += [
        dict(persistent, name="hpz_persistent"),
        dict(persistent, name="hpz_step_writes", exclude_sites=STEP_SEAM)
    ]
    for name, exclude in (("hpz_skip", []), ("hpz_skip_step_writes", STEP_SEAM)):
        runs.append(dict(persistent, name=name, exclude_sites=exclude, skip_update_at=1))
    result = job(runs, world_size=4, steps=3)
    assert_step_writes_skipped(result["runs"], steps=3)
    assert_in_place_like_packed(result, "hpz")
    runs = result["runs"]
    packed, split = runs["hpz"], runs["hpz_split"]
    assert "error" not in packed, packed.get("traceback")
    assert packed["losses"] == split["losses"] and packed["digest"] == split["digest"]
    assert packed["packets"]["packet_all_gathers"] > 0 and packed["collectives"].get("int8", 0) == 0
    assert packed["collectives"]["all_gathers"] == runs["baseline"]["collectives"]["all_gathers"]


def test_persistent_parameters_of_two_dtypes():
    """The mixed model's persistent parameters (fp32 head weight and bias, bf16 gate bias, padded partitions among
    them), gathered again after every step: one all-gather per dtype with the patch, one per parameter with its
    seam left out (DeepSpeed's), bit for bit the same training. (BERT's, one dtype, on every release:
    tests/multirank/test_training.py.)"""
    assert_persistent_gathered_once(job, "mixed", "fp32", 500)


def assert_step_writes_skipped(runs, steps):
    ours = runs["hpz_persistent"]
    for name in ("hpz_persistent", "hpz_step_writes", "hpz_skip", "hpz_skip_step_writes"):
        assert "error" not in runs[name], runs[name].get("traceback")
    persistent = ours["persistent"]["params"]
    assert persistent > 0
    for name in ("hpz_persistent", "hpz_step_writes"):
        # every persistent parameter at every step after the first (which finds the secondary partitions Init
        # wrote), and any other parameter still gathered as a step begins (2 a step before 0.19)
        assert runs[name]["secondary_writes_due"] >= persistent * (steps - 1)
    for name in ("hpz_persistent", "hpz_step_writes", "hpz_skip", "hpz_skip_step_writes"):
        skipped = runs[name]["secondary_writes_skipped"]
        assert skipped == (0 if name.endswith("step_writes") else runs[name]["secondary_writes_due"]), name
    assert ours["losses"] == runs["hpz_step_writes"]["losses"]
    assert ours["digest"] == runs["hpz_step_writes"]["digest"]
    assert runs["hpz_skip"]["skipped_steps"] == runs["hpz_skip_step_writes"]["skipped_steps"] == 1
    assert ours["skipped_steps"] == 0 and runs["hpz_skip"]["digest"] != ours["digest"]
    # After the skipped update DeepSpeed's next forward reads the secondary partitions the skipped step wrote; with
    # the seam every secondary partition was dropped, and it reads the primary ones, as after a completed step: the
    # same weights within the quantization bound (every forward checked), quantized in other groups.
    skip, stock = runs["hpz_skip"], runs["hpz_skip_step_writes"]
    assert skip["losses"][:2] == stock["losses"][:2]
    assert skip["value_errors"] == [] and skip["dtype_errors"] == [] and skip["forward_checks"] > 0
    assert all(abs(a - b) <= loss_tolerance(b) for a, b in zip(skip["losses"], stock["losses"]))


FORWARD_SEAM = [fetch.FORWARD_SITE, fetch.BACKWARD_SITE]


def test_a_forward_quantizes_each_partition_once():
    """A small GPT whose weights each make a fetch of their own (biases and norms persistent, a prefetch bucket
    smaller than a weight, as the HF Trainer's "auto" sizes make them, a reuse distance of about one layer):
    DeepSpeed gathers some weights twice in one step, and the second fetch sends the packet of the first
    (``fetch.quantize_once``). Bit for bit the training of the twin without the engine's forward and backward seams,
    which quantizes at every fetch; the same packet all-gathers, fewer quantizes by the packets sent again, and
    from the second step on those of weights a fetch of their own made in one batch at the first fetch."""
    zero = {
        "stage3_param_persistence_threshold": 1280,
        "stage3_prefetch_bucket_size": 14746,
        "stage3_max_reuse_distance": 200000
    }
    run = dict(quantized=True, digest=True, zero=zero)
    runs = [
        dict(run, name="once"),
        dict(run, name="every_fetch", exclude_sites=FORWARD_SEAM),
        dict(run, name="forward_only", exclude_sites=[fetch.BACKWARD_SITE])
    ]
    result = job(runs, model="gpt", model_args=dict(layers=6, width=128, heads=4, seq=64, vocab=512))
    once, every, forward = (result["runs"][name] for name in ("once", "every_fetch", "forward_only"))
    assert "error" not in once, once.get("traceback")
    assert once["losses"] == every["losses"] and once["digest"] == every["digest"]
    assert once["packets"]["reused"] >= 5 and every["packets"]["reused"] == 0  # 29 over 5 steps at 355eb03
    # each forward after the first quantizes the partitions the one before fetched in one batch
    made = once["packets"]["quantizes"] + once["packets"]["batched"]
    assert made == every["packets"]["quantizes"] - once["packets"]["reused"], once["packets"]
    assert once["packets"]["batches"] == STEPS - 1 and once["packets"]["batched"] > 0  # 80 of 184 made
    assert once["packets"]["packet_all_gathers"] == every["packets"]["packet_all_gathers"]
    # backward sends again packets of weights released in forward, kept past it for those only
    assert forward["losses"] == every["losses"] and forward["digest"] == every["digest"]
    assert once["packets"]["reused"] > forward["packets"]["reused"] > 0, (once["packets"], forward["packets"])
    past = once["packets"]["past_forward"]
    assert 0 < past["kept"] < past["held"], past
