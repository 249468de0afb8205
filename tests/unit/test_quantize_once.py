"""One quantize per partition and forward pass (``patching/seams/fetch.py``): inside the engine's forward a
parameter's partition quantized again returns the packet its first fetch made, unless the partition was written
in between (its version, its address, or a rewrite through ``Init._partition_param``); outside a forward pass,
for other tensors and with explicit groups, every call quantizes."""
import types

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
    """The wrapped quantizer method, counting the packets it makes; the rewrite seam counted as installed."""
    monkeypatch.setitem(installed.replaced, fetch.REWRITE_SITE, None)
    monkeypatch.setattr(fetch.KEPT, "packets", {})
    made = []

    def method(quantizer, param, groups=None):
        made.append(param)
        return ops.quantize_packed(param, groups, backend="torch")

    wrapped = fetch.quantize_once(method)
    wrapped.made = made
    return wrapped


def same_values(packed, other):
    """The same codes and scales (a packet's padding bytes are never written)."""
    return torch.equal(packed[0], other[0]) and torch.equal(packed[1], other[1])


def in_forward(body, quantized_weights=True):
    """Run ``body`` inside the engine-forward seam, as DeepSpeedEngine.forward would."""
    engine = types.SimpleNamespace(zero_quantized_weights=lambda: quantized_weights)
    return fetch.forward_pass(lambda engine: body())(engine)


def test_second_fetch_in_a_forward_sends_the_same_packet(quantize):
    x = partition()
    reused = fetch.KEPT.reused
    first, second = in_forward(lambda: (quantize(None, x), quantize(None, x)))
    assert second is first and len(quantize.made) == 1 and fetch.KEPT.reused == reused + 1
    assert same_values(first, ops.quantize_packed(x, backend="torch"))
    assert fetch.KEPT.packets == {} and not fetch.KEPT.open  # dropped when the forward returns


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
        first = in_forward(lambda: quantize(None, x))
        return first, quantize(None, x)

    first, second = in_forward(body)
    assert second is first and len(quantize.made) == 1 and fetch.KEPT.packets == {}


def test_packets_are_dropped_when_the_forward_raises(quantize):
    x = partition()

    def body():
        quantize(None, x)
        raise RuntimeError("forward failed")

    with pytest.raises(RuntimeError, match="forward failed"):
        in_forward(body)
    assert fetch.KEPT.packets == {} and not fetch.KEPT.open
