"""One quantize per partition and step (``patching/seams/fetch.py``): inside the engine's forward and the backward
after it a parameter's partition quantized again returns the packet its first fetch made, unless the partition was
written in between (its version, its address, or a rewrite through ``Init._partition_param``); the next forward
starts afresh, quantizing the partitions the last one fetched at once at its first fetch of one; outside them, for
other tensors and with explicit groups, every call quantizes."""
import gc
import types
import weakref

import pytest
import torch

from deepspeed_zeropp import ops
from deepspeed_zeropp.patching import installed
from deepspeed_zeropp.patching.seams import fetch, partitions


def partition(numel=1000, seed=0):
    """A stand-in for a parameter's ``ds_tensor``: DeepSpeed marks partitions with ``ds_numel``."""
    tensor = torch.randn(numel, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)
    tensor.ds_numel = numel
    return tensor


@pytest.fixture
def quantize(monkeypatch):
    """The wrapped quantizer method, counting the packets it makes one by one (``made``) and the partitions of each
    batch (``batches``, their ids); the rewrite seam counted as installed."""
    monkeypatch.setitem(installed.replaced, fetch.REWRITE_SITE, None)
    for name, empty in (("packets", {}), ("released", set()), ("fresh", set()), ("fetched", {}), ("plan", {}),
                        ("plans", weakref.WeakKeyDictionary())):
        monkeypatch.setattr(fetch.KEPT, name, empty)
    made, batches = [], []

    def method(quantizer, param, groups=None):
        made.append(param)
        return ops.quantize_packed(param, groups, backend="torch")

    def many(quantizer, params):
        batches.append([id(param) for param in params])
        return ops.quantize_packed_many(params, backend="torch")

    wrapped = fetch.quantize_once(method, many)
    wrapped.made, wrapped.batches = made, batches
    return wrapped


def same_values(packed, other):
    """The same codes and scales (a packet's padding bytes are never written)."""
    return torch.equal(packed[0], other[0]) and torch.equal(packed[1], other[1])


class Engine:
    """A stand-in for a DeepSpeedEngine: whether it runs qwZ."""

    def __init__(self, quantized_weights=True):
        self.quantized_weights = quantized_weights

    def zero_quantized_weights(self):
        return self.quantized_weights


ENGINE = Engine()


def engine_call(seam, body, quantized_weights=True, engine=ENGINE):
    return seam(lambda engine: body())(engine if quantized_weights else Engine(False))


def in_forward(body, quantized_weights=True, engine=ENGINE):
    """Run ``body`` inside the engine-forward seam, as DeepSpeedEngine.forward would."""
    return engine_call(fetch.forward_pass, body, quantized_weights, engine)


def in_backward(body):
    return engine_call(fetch.backward_pass, body)


def release(x):
    """DeepSpeed releasing the gathered parameter whose partition is ``x``, through the partition seam."""
    partitions.partition_param(lambda init, param, *a, **k: None)(None, types.SimpleNamespace(ds_tensor=x), None,
                                                                  False)


def fetch_and_release(quantize, x):
    packet = quantize(None, x)
    release(x)
    return packet


def test_second_fetch_in_a_forward_sends_the_same_packet(quantize):
    x = partition()
    reused = fetch.KEPT.reused
    first, second = in_forward(lambda: (quantize(None, x), quantize(None, x)))
    assert second is first and len(quantize.made) == 1 and fetch.KEPT.reused == reused + 1
    assert same_values(first, ops.quantize_packed(x, backend="torch"))
    assert not fetch.KEPT.open and fetch.KEPT.packets == {}  # still gathered: backward will not fetch it


def test_forward_keeps_for_backward_the_packets_of_released_parameters_only(quantize):
    x, y, z = partition(), partition(seed=1), partition(seed=2)

    def body():
        fetch_and_release(quantize, x)  # released, not gathered again: backward will fetch it
        quantize(None, y)  # still gathered as forward ends
        fetch_and_release(quantize, z)
        quantize(None, z)  # released, then gathered again (a prefetch for backward)

    in_forward(body)
    assert list(fetch.KEPT.packets) == [id(x)]


def test_backward_sends_its_forwards_packets_and_drops_them(quantize):
    x, y = partition(), partition(seed=1)
    first = in_forward(lambda: fetch_and_release(quantize, x))
    assert quantize(None, x) is not first  # between forward and backward nothing is sent again
    second, _ = in_backward(lambda: (quantize(None, x), quantize(None, y)))
    assert second is first and len(quantize.made) == 3 and fetch.KEPT.packets == {}


def test_a_forward_without_autograd_keeps_nothing_past_it(quantize):
    x = partition()
    with torch.no_grad():  # evaluation: no backward follows
        in_forward(lambda: fetch_and_release(quantize, x))
    assert fetch.KEPT.packets == {} and fetch.KEPT.released == set()


def test_nothing_of_a_partition_outlives_its_step(quantize):
    quantize = fetch.quantize_once(lambda quantizer, param, groups=None: ops.quantize_packed(param, groups, "torch"),
                                   lambda quantizer, params: ops.quantize_packed_many(params, "torch"))

    def step():
        x = partition()
        for _ in range(2):  # the second forward quantizes it ahead
            in_forward(lambda: fetch_and_release(quantize, x))
            in_backward(lambda: quantize(None, x))
        return weakref.ref(x)

    batched = fetch.KEPT.batched
    alive = step()
    gc.collect()
    assert alive() is None and fetch.KEPT.batched == batched + 1  # nothing of it is held once backward returns


def test_the_next_forward_drops_the_last_ones_packets(quantize):
    x = partition()
    first = in_forward(lambda: fetch_and_release(quantize, x))  # a loss computed for logging: no backward follows
    assert list(fetch.KEPT.packets) == [id(x)]
    x.data.copy_(partition(seed=1))  # a write nothing sees (as an optimizer's or a checkpoint load's)
    second = in_forward(lambda: quantize(None, x))
    assert second is not first and same_values(second, ops.quantize_packed(x, backend="torch"))


def test_the_next_forward_quantizes_the_last_ones_partitions_at_once(quantize):
    xs = [partition(seed=i) for i in range(3)]
    in_forward(lambda: [fetch_and_release(quantize, x) for x in xs])
    assert len(quantize.made) == 3 and quantize.batches == []
    for i, x in enumerate(xs):
        x.data.copy_(partition(seed=10 + i))  # the optimizer's step: a write nothing sees
    reused, batched = fetch.KEPT.reused, fetch.KEPT.batched

    def body():
        assert quantize.batches == []  # nothing before the first fetch
        return [quantize(None, x) for x in reversed(xs)]

    sent = in_forward(body)
    assert quantize.batches == [[id(x) for x in xs]] and len(quantize.made) == 3
    assert fetch.KEPT.reused == reused and fetch.KEPT.batched == batched + 3  # made ahead, sent once: no reuse
    for x, packet in zip(reversed(xs), sent):
        assert same_values(packet, ops.quantize_packed(x, backend="torch"))  # the values at the forward, not before


def test_a_partition_written_after_the_batch_is_quantized_again(quantize):
    x, y = partition(), partition(seed=1)
    in_forward(lambda: (quantize(None, x), quantize(None, y)))

    def body():
        quantize(None, x)  # quantizes x and y
        y.copy_(partition(seed=2))  # in place: its version moves
        return quantize(None, y)

    second = in_forward(body)
    assert len(quantize.batches) == 1 and quantize.made[2:] == [y]
    assert same_values(second, ops.quantize_packed(y, backend="torch"))


def test_only_partitions_where_they_were_are_quantized_ahead(quantize):
    x, y, z = partition(), partition(seed=1), [partition(seed=2)]
    in_forward(lambda: [quantize(None, t) for t in (x, y, z[0])])
    y.data = partition(seed=3)  # new memory (a swap-in, a checkpoint loaded into new buffers)
    dead = weakref.ref(z.pop())
    quantize.made.clear()
    gc.collect()
    assert dead() is None  # the plan holds no partition alive
    in_forward(lambda: (quantize(None, x), quantize(None, y)))
    assert quantize.batches == [[id(x)]] and quantize.made == [y]


def test_a_partition_made_ahead_but_not_fetched_is_dropped_and_not_planned(quantize):
    x, y = partition(), partition(seed=1)
    in_forward(lambda: (fetch_and_release(quantize, x), fetch_and_release(quantize, y)))
    in_forward(lambda: fetch_and_release(quantize, x))  # quantizes x and y; y not fetched
    assert list(fetch.KEPT.packets) == [id(x)] and fetch.KEPT.fresh == set()
    in_forward(lambda: quantize(None, x))
    assert quantize.batches == [[id(x), id(y)], [id(x)]] and len(quantize.made) == 2


def test_engines_whose_forwards_alternate_keep_a_plan_each(quantize):
    actor, critic = Engine(), Engine()
    x, y = partition(), partition(seed=1)
    for _ in range(2):
        in_forward(lambda: quantize(None, x), engine=actor)
        in_forward(lambda: quantize(None, y), engine=critic)
    assert quantize.batches == [[id(x)], [id(y)]] and quantize.made == [x, y]
    in_forward(lambda: quantize(None, x), engine=types.SimpleNamespace(zero_quantized_weights=lambda: True))
    assert len(quantize.batches) == 2 and quantize.made == [x, y, x]  # no weak reference to it: no plan


def test_without_a_batch_each_fetch_quantizes(quantize):
    """A quantizer whose batch answers None (quantization deferred), or none at all: one quantize per fetch."""
    x, made = partition(), []

    def method(quantizer, param, groups=None):
        made.append(param)
        return ops.quantize_packed(param, groups, backend="torch")

    batched = fetch.KEPT.batched
    for batch in (lambda quantizer, params: None, None):
        wrapped = fetch.quantize_once(method, batch)
        in_forward(lambda: wrapped(None, x))
        in_forward(lambda: wrapped(None, x))
    assert len(made) == 4 and fetch.KEPT.batched == batched


def test_outside_a_forward_every_call_quantizes(quantize):
    x = partition()
    first, second = quantize(None, x), quantize(None, x)
    assert second is not first and len(quantize.made) == 2


@pytest.mark.parametrize("write", ["in_place", "new_memory", "rewrite_seam"])
def test_a_written_partition_is_quantized_again(quantize, write):
    x = partition()
    other = partition(seed=1)

    def body():
        first = quantize(None, x)
        if write == "in_place":  # bumps the version counter
            x.copy_(other)
        elif write == "new_memory":  # DeepSpeed re-points partitions through .data (no version bump)
            x.data = other.clone()
        else:  # GatheredParameters(modifier_rank=...) rewrites through Init._partition_param(has_been_updated)
            x.data.copy_(other)
            partitions.partition_param(lambda init, param, *a, **k: None)(None, None, None, True)
        return first, quantize(None, x)

    first, second = in_forward(body)
    assert second is not first and len(quantize.made) == 2
    assert same_values(second, ops.quantize_packed(other, backend="torch"))


def test_only_whole_partitions_with_default_groups_are_kept(quantize):
    bucket = torch.randn(1000).to(torch.bfloat16)  # a bucket's concatenation: no ds_numel, new at every fetch
    x = partition()
    in_forward(lambda: (quantize(None, bucket), quantize(None, bucket), quantize(None, x, 8), quantize(None, x, 8)))
    assert len(quantize.made) == 4


def test_inert_without_qwz(quantize):
    x = partition()
    in_forward(lambda: (quantize(None, x), quantize(None, x)), quantized_weights=False)
    assert len(quantize.made) == 2 and not fetch.KEPT.open


def test_without_the_rewrite_seam_nothing_is_kept(quantize, monkeypatch):
    monkeypatch.delitem(installed.replaced, fetch.REWRITE_SITE)
    x = partition()
    in_forward(lambda: (quantize(None, x), quantize(None, x)))
    assert len(quantize.made) == 2


def test_a_nested_forward_leaves_the_packets_to_the_outer_one(quantize):
    x = partition()

    def body():
        first = in_forward(lambda: fetch_and_release(quantize, x))
        return first, fetch_and_release(quantize, x)

    first, second = in_forward(body)
    assert second is first and len(quantize.made) == 1 and list(fetch.KEPT.packets) == [id(x)]


@pytest.mark.parametrize("call", [in_forward, in_backward])
def test_packets_are_dropped_when_the_engine_call_raises(quantize, call):
    x = partition()

    def body():
        quantize(None, x)
        raise RuntimeError("the call failed")

    with pytest.raises(RuntimeError, match="the call failed"):
        call(body)
    assert fetch.KEPT.packets == {} and not fetch.KEPT.open
