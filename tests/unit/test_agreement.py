"""The agreement check (agreement.py) on a stand-in key-value store: what a fully patched job pays, the error text
when a rank is missing or different, and where the patch calls it (only on paths a ZeRO++ flag opens); the worlds it
does not check (torch's fake backend, DEEPSPEED_ZEROPP_AGREEMENT=off) and stores that cannot take part."""
import logging
import time
import types
from datetime import timedelta

import pytest
import torch

from deepspeed_zeropp import agreement, backends, formats
from deepspeed_zeropp.patching.seams import partitions, replacements


class Store:
    """The parts of torch's Store the check uses, in memory; every call is logged. ``wait`` returns at once when
    every key is there and raises as a timed-out wait otherwise; ``broken`` makes reads fail as with the store's
    host gone."""

    def __init__(self, keys=None, broken=False):
        self.keys, self.calls, self.broken = dict(keys or {}), [], broken

    def set(self, key, value):
        self.calls.append("set")
        self.keys[key] = value.encode() if isinstance(value, str) else value

    def wait(self, keys, timeout):
        self.calls.append("wait")
        assert timeout.total_seconds() > 0
        if not all(key in self.keys for key in keys):
            raise RuntimeError("Wait timeout")

    def check(self, keys):
        self.calls.append("check")
        if self.broken:
            raise ConnectionResetError("Connection reset by peer")
        return all(key in self.keys for key in keys)

    def get(self, key):
        self.calls.append("get")
        return self.keys[key]


def as_patched():
    """What a fully patched rank answers to ``sends_packets`` (nothing is patched in these tests)."""
    return True


def answer(host="node-a", wire=None, backend="auto"):
    return agreement.Answer(host, "0.1.0", "0.19.8", formats.WIRE_FORMAT_VERSION if wire is None else wire, backend,
                            backends.family(backend))


def published(store, rank, what, prefix="p"):
    """``store`` as rank ``rank`` running ``what`` leaves it after its sets."""
    store.keys[f"{prefix}/rank{rank}"] = what.encode().encode()
    store.keys[f"{prefix}/{what.token}/rank{rank}"] = b"1"
    return store


def failure(store, rank, world, mine, seconds=5):
    with pytest.raises(agreement.AgreementError) as raised:
        agreement.exchange(store, rank, world, mine, seconds, "p")
    return str(raised.value)


def test_fully_patched_world_pays_one_wait_and_reads_nothing():
    store = published(Store(), 1, answer("node-b"))
    agreement.exchange(store, 0, 2, answer(), 5, "p")
    assert store.calls == ["set", "set", "wait"]  # the sets are not answered: one round trip


def test_missing_rank_named_with_the_fix():
    text = failure(Store(), 0, 2, answer("node-a"))
    lines = text.splitlines()
    assert lines[0].startswith("deepspeed_zeropp: rank 0 of 2 stops before its first quantized collective")
    assert f"wire format {formats.WIRE_FORMAT_VERSION} and backend family native" in lines[0]
    assert lines[1] == (
        f"  rank 0 (host node-a): deepspeed_zeropp 0.1.0 on DeepSpeed 0.19.8, wire format "
        f"{formats.WIRE_FORMAT_VERSION}, backend auto (native), codes and scales in one packet [this rank]")
    assert lines[2].startswith("  rank 1 (host unknown): no answer within 5 s: the patch is not active there")
    fix = lines[-1]
    assert fix.startswith("Fix: patch every rank the same way. Set DEEPSPEED_ZEROPP=1 (and DEEPSPEED_ZEROPP_BACKEND")
    for remedy in ("deepspeed --hostfile", "DEEPSPEED_ZEROPP* variables", "mpirun -x", "srun --export",
                   ".deepspeed_env", "deepspeed_zeropp.patch() in the training script"):
        assert remedy in fix, remedy


def test_different_wire_format_and_backend_family_named():
    store = published(Store(), 1, answer("node-b", wire=formats.WIRE_FORMAT_VERSION + 1))
    published(store, 2, answer("node-c", backend="deepspeed"))
    published(store, 3, answer("node-a", backend="torch"))
    text = failure(store, 0, 4, answer("node-a"))
    assert f"  rank 1 (host node-b): deepspeed_zeropp 0.1.0 on DeepSpeed 0.19.8, wire format " \
           f"{formats.WIRE_FORMAT_VERSION + 1}, backend auto (native), codes and scales in one packet [DIFFERENT]" in text
    assert "  rank 2 (host node-c): " in text and "backend deepspeed (deepspeed-op), codes and scales in one packet [DIFFERENT]" in text
    assert "  rank 3 (host node-a): " in text and "backend torch (native), codes and scales in one packet [agrees]" in text  # same family


def test_ranks_grouped_by_what_they_run():
    store = Store()
    for rank in (1, 2, 7):
        published(store, rank, answer(f"node-{rank // 4}"))
    for rank in (4, 5):
        published(store, rank, answer("node-1", wire=formats.WIRE_FORMAT_VERSION + 1))
    text = failure(store, 0, 8, answer("node-0"))
    assert "  ranks 0-2, 7 (hosts node-0, node-1): " in text and text.count("[as this rank]") == 1
    assert "  ranks 4-5 (host node-1): " in text and "[DIFFERENT]" in text
    assert "  ranks 3, 6 (host unknown): no answer within 5 s" in text


def test_store_gone_says_so():
    text = failure(Store(broken=True), 1, 3, answer("node-b"))
    assert "  rank 1 (host node-b): " in text and "[this rank]" in text
    assert ("  ranks 0, 2: unknown, the store could not be read (ConnectionResetError: Connection reset by peer); "
            "the process serving it (rank 0, or the launcher's agent) has probably stopped") in text


@pytest.fixture
def two_ranks(monkeypatch):
    """torch.distributed initialised with 2 ranks (this one 0), the other rank patched alike; a fresh check."""
    import torch.distributed as dist
    store = Store()
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 0)
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "gloo")
    monkeypatch.setattr(agreement, "_store", lambda: store)
    monkeypatch.setattr(agreement, "_round", 0)
    monkeypatch.setattr(agreement, "_noted", set())
    monkeypatch.delenv("DEEPSPEED_ZEROPP_AGREEMENT", raising=False)
    agreement.reset()
    yield store
    agreement.reset()
    backends.set_default("auto")


def test_checked_once_per_backend(two_ranks):
    store = two_ranks
    published(store, 1, answer(), prefix=f"{agreement.KEY}/0")
    agreement.ensure(as_patched)
    agreement.ensure(as_patched)
    assert store.calls == ["set", "set", "wait"]
    backends.set_default("torch")  # another backend: checked again, in the next round
    published(store, 1, answer(backend="torch"), prefix=f"{agreement.KEY}/1")
    agreement.ensure(as_patched)
    assert store.calls == ["set", "set", "wait"] * 2
    assert agreement.Answer.decode(store.keys[f"{agreement.KEY}/1/rank0"]).backend == "torch"


def test_wire_format_version_read_from_formats(two_ranks, monkeypatch):
    """A rank with a bumped formats.WIRE_FORMAT_VERSION no longer agrees with one that has the old one."""
    store = two_ranks
    published(store, 1, answer(), prefix=f"{agreement.KEY}/0")
    monkeypatch.setattr(formats, "WIRE_FORMAT_VERSION", formats.WIRE_FORMAT_VERSION + 1)
    with pytest.raises(agreement.AgreementError, match=r"rank 1 \(host node-a\): .* \[DIFFERENT\]"):
        agreement.ensure(as_patched)


def test_nothing_to_check_without_distributed_or_peers(monkeypatch):
    import torch.distributed as dist
    monkeypatch.setattr(agreement, "_store", lambda: pytest.fail("store used"))
    agreement.reset()
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    agreement.ensure(as_patched)
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 1)
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 0)
    agreement.ensure(as_patched)
    agreement.reset()


@pytest.mark.parametrize("value", ["abc", "0", "-3", "inf", "nan"])
def test_bad_timeout_is_refused_with_what_is_accepted(monkeypatch, value):
    monkeypatch.setenv("DEEPSPEED_ZEROPP_AGREEMENT_TIMEOUT", value)
    with pytest.raises(ValueError, match=r"DEEPSPEED_ZEROPP_AGREEMENT_TIMEOUT=.* is not a positive number of seconds"):
        agreement.timeout()


def test_timeout_default_and_override(monkeypatch):
    monkeypatch.delenv("DEEPSPEED_ZEROPP_AGREEMENT_TIMEOUT", raising=False)
    assert agreement.timeout() == agreement.TIMEOUT
    monkeypatch.setenv("DEEPSPEED_ZEROPP_AGREEMENT_TIMEOUT", "12.5")
    assert agreement.timeout() == 12.5


@pytest.fixture
def calls(monkeypatch):
    """Order of agreement checks and the work they guard."""
    log = []
    monkeypatch.setattr(agreement, "ensure", lambda sends_packets: log.append("ensure"))
    return log


class Stop(Exception):
    pass


@pytest.mark.parametrize("seam", ["quantizer_quantize", "quant_reduce", "loco_quant_reduce"])
def test_entry_points_check_before_they_work(monkeypatch, seam):
    """A failing check stops each entry point before its implementation sees the (here unusable) arguments."""

    def refuse(sends_packets):
        raise Stop()

    monkeypatch.setattr(agreement, "ensure", refuse)
    with pytest.raises(Stop):
        getattr(replacements, seam)(None)(None, None)


def test_mixz_after_partitioning_checks_only_when_on(calls, monkeypatch):
    monkeypatch.setattr(partitions, "quantize_nontrainable_params", lambda optimizer: calls.append("quantize"))
    seam = partitions.nontrainable_seam(lambda optimizer: calls.append("upstream"))
    seam(types.SimpleNamespace(zero_quantized_nontrainable_weights=False))
    assert calls == ["upstream"]
    seam(types.SimpleNamespace(zero_quantized_nontrainable_weights=True))
    assert calls == ["upstream", "ensure", "quantize"]


def test_quantize_seam_checks_then_quantizes(calls, monkeypatch):
    from deepspeed_zeropp.patching.quantizer import QuantizerMethods
    monkeypatch.setattr(agreement, "ensure", lambda sends_packets: calls.append("ensure"))
    method = replacements.quantizer_quantize(None)
    codes, scales = method(QuantizerMethods(), torch.ones(64))
    assert calls == ["ensure"] and codes.dtype == torch.int8


def test_ranks_sending_packets_and_ranks_sending_apart_disagree():
    """A patch that leaves the fetch seam out sends codes and scales in two all-gathers, which a rank reading
    packets cannot take: the token differs, the error says which rank sends how, and own_answer reports it."""
    from deepspeed_zeropp.patching import apply
    from deepspeed_zeropp.patching.seams.fetch import FETCH_SITE, sends_packets
    apart = answer("node-b")._replace(packets=False)
    assert apart.token != answer().token
    text = failure(published(Store(), 1, apart), 0, 2, answer())
    assert "codes and scales in two all-gathers [DIFFERENT]" in text and "codes and scales in one packet" in text
    try:
        apply.patch()
        assert agreement.own_answer(sends_packets()).packets
        apply.unpatch()
        apply.patch(exclude=(FETCH_SITE, ))
        assert not agreement.own_answer(sends_packets()).packets
    finally:
        apply.unpatch()
    assert agreement.Answer.decode(answer().encode()) == answer()


# -- the switch, the worlds not checked, stores that cannot take part --


@pytest.mark.parametrize("value, wanted", [(None, True), ("", True), ("on", True), ("1", True), (" ON ", True),
                                           ("true", True), ("off", False), ("0", False), ("Off", False), ("no", False),
                                           ("false", False)])
def test_switch_values(monkeypatch, value, wanted):
    from deepspeed_zeropp import _env
    if value is None:
        monkeypatch.delenv("DEEPSPEED_ZEROPP_AGREEMENT", raising=False)
    else:
        monkeypatch.setenv("DEEPSPEED_ZEROPP_AGREEMENT", value)
    assert _env.agreement_wanted() is wanted


@pytest.mark.parametrize("value", ["maybe", "2", "disabled"])
def test_bad_switch_value_is_refused_naming_the_accepted_ones(monkeypatch, two_ranks, value):
    from deepspeed_zeropp import _env
    monkeypatch.setenv("DEEPSPEED_ZEROPP_AGREEMENT", value)
    with pytest.raises(ValueError) as raised:
        _env.agreement_wanted()
    text = str(raised.value)
    assert text.startswith(f"DEEPSPEED_ZEROPP_AGREEMENT={value!r} is not understood; accepted values: 1, true, yes, "
                           f"on or unset"), text
    assert "0, false, no, off (no check" in text
    with pytest.raises(ValueError, match="DEEPSPEED_ZEROPP_AGREEMENT="):  # the first quantize stops, store unused
        agreement.ensure(as_patched)
    assert two_ranks.calls == []


def test_switched_off_checks_nothing_and_rank_0_says_so_once(monkeypatch, two_ranks, caplog):
    caplog.set_level(logging.INFO, logger="deepspeed_zeropp")
    monkeypatch.setenv("DEEPSPEED_ZEROPP_AGREEMENT", "off")
    for _ in range(3):
        agreement.ensure(as_patched)
        agreement.reset()  # checked again: still one line
    assert two_ranks.calls == []
    lines = [r for r in caplog.records if "DEEPSPEED_ZEROPP_AGREEMENT=off" in r.getMessage()]
    assert len(lines) == 1 and lines[0].levelno == logging.WARNING, caplog.records
    assert "a rank left unpatched trains on different numerics without a word" in lines[0].getMessage()


def fake_world_lines(caplog):
    return [r.getMessage() for r in caplog.records if "'fake' backend" in r.getMessage()]


def test_fake_backend_is_not_checked_and_rank_0_says_so_once(caplog, monkeypatch):
    """torch's own fake process group over its FakeStore (which implements no key-value call): the first quantize
    used to end in torch's 'Not implemented' from the store's set; now nothing is asked of the store and rank 0 logs
    one line, once per process, however often the check is started."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore
    if dist.is_initialized():
        pytest.skip("torch.distributed is already initialised in this process")
    caplog.set_level(logging.INFO, logger="deepspeed_zeropp")
    monkeypatch.setattr(agreement, "_noted", set())
    monkeypatch.delenv("DEEPSPEED_ZEROPP_AGREEMENT", raising=False)
    agreement.reset()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=8)
    try:
        assert dist.get_backend() == "fake"
        for _ in range(3):
            agreement.ensure(as_patched)
            agreement.reset()
    finally:
        dist.destroy_process_group()
        agreement.reset()
    lines = fake_world_lines(caplog)
    assert lines == [
        "deepspeed_zeropp: torch.distributed runs the 'fake' backend (8 ranks stood for by this process, "
        "no peers): the check that every rank runs the patch alike does not run"
    ], caplog.records


def test_fake_backend_over_a_real_store_does_not_wait_for_ranks_that_do_not_exist(caplog, monkeypatch):
    """Over a HashStore the check would have waited its whole bound and named seven ranks as "no answer"."""
    import torch.distributed as dist
    if dist.is_initialized():
        pytest.skip("torch.distributed is already initialised in this process")
    caplog.set_level(logging.INFO, logger="deepspeed_zeropp")
    monkeypatch.setattr(agreement, "_noted", set())
    monkeypatch.delenv("DEEPSPEED_ZEROPP_AGREEMENT", raising=False)
    agreement.reset()
    dist.init_process_group("fake", store=dist.HashStore(), rank=0, world_size=8)
    try:
        start = time.monotonic()
        agreement.ensure(as_patched)
        assert time.monotonic() - start < 1.0
    finally:
        dist.destroy_process_group()
        agreement.reset()
    assert len(fake_world_lines(caplog)) == 1


def test_fake_backend_other_ranks_log_nothing(two_ranks, monkeypatch, caplog):
    import torch.distributed as dist
    caplog.set_level(logging.INFO, logger="deepspeed_zeropp")
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "fake")
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 1)
    agreement.ensure(as_patched)
    assert two_ranks.calls == [] and fake_world_lines(caplog) == []


class RefusingStore(Store):
    """A store whose ``set`` raises ``error``."""

    def __init__(self, error):
        super().__init__()
        self.error = error

    def set(self, key, value):
        self.calls.append("set")
        raise self.error


def store_failure(store, seconds=300):
    """The AgreementError of one exchange on ``store`` (rank 0 of 8) and how long it took to come."""
    start = time.monotonic()
    with pytest.raises(agreement.AgreementError) as raised:
        agreement.exchange(store, 0, 8, answer(), seconds, "p")
    return str(raised.value), time.monotonic() - start


def test_store_whose_set_is_not_implemented_stops_at_once_naming_it(two_ranks, monkeypatch):
    """Through ensure, as the first quantize calls it: an AgreementError within a second (not the 300 s bound),
    naming the store's class, the call, torch's message and both ways out."""
    store = RefusingStore(RuntimeError("fn INTERNAL ASSERT FAILED at init.cpp:221. Not implemented."))
    monkeypatch.setattr(agreement, "_store", lambda: store)
    start = time.monotonic()
    with pytest.raises(agreement.AgreementError) as raised:
        agreement.ensure(as_patched)
    assert time.monotonic() - start < 1.0
    first, cause, fix = str(raised.value).splitlines()
    assert first == ("deepspeed_zeropp: rank 0 of 2 cannot check, before its first quantized collective, that every "
                     "rank runs the patch alike: the process group's store (tests.unit.test_agreement.RefusingStore) "
                     "failed at set: RuntimeError: fn INTERNAL ASSERT FAILED at init.cpp:221. Not implemented.")
    assert cause == "The check needs the store's key-value calls (set, wait, check, get); this store does not " \
                    "implement set."
    assert fix.startswith("Fix: initialise torch.distributed with a store that implements them (the env:// or tcp:// "
                          "rendezvous gives a TCPStore, file:// a FileStore")
    assert "set DEEPSPEED_ZEROPP_AGREEMENT=off on every rank" in fix and "'fake' backend" in fix
    assert "a rank left unpatched is not stopped: it trains on different numerics without a word" in fix
    assert store.calls == ["set"]


def test_torchs_fake_store_named_through_its_prefix_store():
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore
    fake = FakeStore()
    text, seconds = store_failure(dist.PrefixStore("default_pg", fake))
    assert seconds < 1.0
    assert ("the process group's store (torch.testing._internal.distributed.fake_pg.FakeStore inside PrefixStore) "
            "failed at set: RuntimeError: ") in text and "Not implemented" in text, text


def test_store_whose_set_fails_says_its_server_may_have_stopped():
    text, seconds = store_failure(RefusingStore(ConnectionRefusedError("Connection refused")))
    assert seconds < 1.0
    assert "failed at set: ConnectionRefusedError: Connection refused" in text
    assert "its set failed: the process serving it (rank 0, or the launcher's agent) may have stopped" in text
    assert "DEEPSPEED_ZEROPP_AGREEMENT=off" in text


def test_store_without_wait_or_check_is_named_not_waited_for():
    """A Python store lacking ``wait`` (torch: "pure virtual function"), and one whose ``wait`` times out but that
    lacks ``check``: each named with its missing call, not reported as ranks that never answered."""
    import torch.distributed as dist

    class SetOnly(dist.Store):

        def set(self, key, value):
            pass

    text, seconds = store_failure(SetOnly())
    assert seconds < 1.0
    assert "failed at wait: RuntimeError: " in text and "pure virtual" in text and "does not implement wait" in text
    assert "no answer" not in text

    class NoCheck(Store):

        def check(self, keys):
            raise NotImplementedError("check")

    text, _ = store_failure(NoCheck())
    assert "failed at check: NotImplementedError: check" in text and "does not implement check" in text


def test_real_stores_keep_their_behaviour():
    """HashStore (as TCPStore and FileStore, torch's real stores): a fully patched world passes; a missing rank is
    reported after the bound as before."""
    import torch.distributed as dist
    store = dist.HashStore()
    peer = answer("node-b")
    store.set("p/rank1", peer.encode())
    store.set(f"p/{peer.token}/rank1", "1")
    agreement.exchange(store, 0, 2, answer(), 5, "p")
    start = time.monotonic()
    with pytest.raises(agreement.AgreementError) as raised:
        agreement.exchange(store, 0, 3, answer(), 0.5, "p")
    assert time.monotonic() - start >= 0.5
    assert "  rank 2 (host unknown): no answer within 0.5 s" in str(raised.value)
    assert store.wait(["p/rank0"], timedelta(seconds=1)) is None  # this rank published


@pytest.mark.parametrize("value, level, words", [
    (None, None, None),
    ("on", "ok", "DEEPSPEED_ZEROPP_AGREEMENT=on: at its first quantized collective every rank checks"),
    ("off", "warning", "DEEPSPEED_ZEROPP_AGREEMENT=off: the ranks do not check that all run the patch alike; a rank "
     "left unpatched then trains on different numerics without a word"),
    ("sometimes", "PROBLEM", "DEEPSPEED_ZEROPP_AGREEMENT='sometimes' is not understood; accepted values: "),
])
def test_doctor_reports_the_switch_when_set(monkeypatch, value, level, words):
    from deepspeed_zeropp import doctor
    if value is None:
        monkeypatch.delenv("DEEPSPEED_ZEROPP_AGREEMENT", raising=False)
    else:
        monkeypatch.setenv("DEEPSPEED_ZEROPP_AGREEMENT", value)
    monkeypatch.delenv("DEEPSPEED_ZEROPP_AGREEMENT_TIMEOUT", raising=False)
    found = [(lvl, text) for lvl, text in doctor._activation_checks() if "DEEPSPEED_ZEROPP_AGREEMENT=" in text]
    if value is None:
        assert found == []
    else:
        assert len(found) == 1 and found[0][0] == level and words in found[0][1], found
