"""Packets (docs/numerics.md, "Packets"): a rank's codes and scales in one byte buffer, gathered in one all-gather and
read in place; the fetch seam that sends them (patching/seams/fetch.py). Values bit for bit those of the codes and
scales sent apart, with and without a backend's in-place entry points."""
import types

import pytest
import torch

from deepspeed_zeropp import ops
from deepspeed_zeropp.backends import torch_ref
from deepspeed_zeropp.formats import int8
from deepspeed_zeropp.formats.grouping import group_layout
from deepspeed_zeropp.patching.seams import fetch as protocol
from tests.helpers import assert_bitwise

SIZES = [1, 15, 16, 257, 8000, 8001, 16000, 24576, 40000]
DTYPES = [torch.float16, torch.bfloat16, torch.float32]


@pytest.mark.parametrize("numel", SIZES)
def test_packet_layout(numel):
    """Codes at 0, scales at the next multiple of 16 bytes, the packet a multiple of 16 bytes."""
    layout = group_layout(numel)
    packet = int8.packet(numel, layout.groups, layout.group_size)
    assert packet.scales_at % 16 == 0 and numel <= packet.scales_at < numel + 16
    assert packet.nbytes % 16 == 0 and packet.scales_at + 4 * layout.groups <= packet.nbytes
    assert packet.nbytes < packet.scales_at + 4 * layout.groups + 16


@pytest.mark.parametrize("numel", SIZES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_quantize_packed_equals_quantize(numel, dtype):
    x = torch.randn(numel, generator=torch.Generator().manual_seed(numel)).to(dtype) * 3
    codes, scales = ops.quantize_packed(x, backend="torch")
    expected_codes, expected_scales = ops.quantize(x, backend="torch")
    assert_bitwise(codes, expected_codes)
    assert_bitwise(scales, expected_scales)
    info = ops.packet_of(codes)
    buffer, layout = info.buffer, info.layout
    assert ops.packet_of(scales) is info and buffer.dtype == torch.uint8 and buffer.numel() == layout.nbytes
    assert codes.data_ptr() == buffer.data_ptr() and scales.data_ptr() == buffer.data_ptr() + layout.scales_at


@pytest.mark.parametrize("limit", [None, 2])
def test_quantize_packed_many_equals_one_by_one(limit, monkeypatch):
    """The batch gives each input quantize_packed's packet (its own buffer and layout), inputs of one device and dtype
    in calls of at most the backend's MAX_SEGMENTS, the other dtypes in calls of their own; a non-contiguous input
    goes alone."""
    calls = []
    many_into = torch_ref.quantize_many_into

    def counted(xs, *args):
        calls.append([x.dtype for x in xs])
        many_into(xs, *args)

    monkeypatch.setattr(torch_ref, "quantize_many_into", counted)
    if limit is not None:
        monkeypatch.setattr(torch_ref, "MAX_SEGMENTS", limit, raising=False)
    gen = torch.Generator().manual_seed(3)
    dtypes = [torch.bfloat16, torch.float32, torch.bfloat16, torch.bfloat16, torch.float16, torch.bfloat16]
    xs = [(torch.randn(numel, generator=gen) * 3).to(dtype) for numel, dtype in zip(SIZES, dtypes)]
    xs.append(torch.randn(40, 30, generator=gen).t())
    results = ops.quantize_packed_many(xs, backend="torch")
    for x, (codes, scales) in zip(xs, results):
        want_codes, want_scales = ops.quantize_packed(x, backend="torch")
        assert_bitwise(codes, want_codes)
        assert_bitwise(scales, want_scales)
        info = ops.packet_of(codes)
        assert info is ops.packet_of(scales) and info.layout == ops.packet_of(want_codes).layout
        assert info.buffer.numel() == info.layout.nbytes and codes.data_ptr() == info.buffer.data_ptr()
    bf16 = [torch.bfloat16] * 4
    assert calls == ([bf16, [torch.float32], [torch.float16]]
                     if limit is None else [bf16[:2], bf16[2:], [torch.float32], [torch.float16]])
    assert ops.quantize_packed_many([], backend="torch") == []


def _gathered(parts):
    """What an all-gather of packets (one per rank) and of codes and scales apart would receive."""
    packed = [ops.quantize_packed(part, backend="torch") for part in parts]
    received = torch.cat([ops.packet_of(codes).buffer for codes, _ in packed])
    codes = torch.cat([codes.view(-1) for codes, _ in packed])
    scales = torch.cat([scales for _, scales in packed])
    return received, ops.packet_of(packed[0][0]).layout, codes, scales


@pytest.mark.parametrize("numel", [257, 8001, 16000, 40000])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("ranks", [1, 2, 3])
def test_dequantize_packed_equals_blocks(numel, dtype, ranks):
    """Read in place (the torch backend) or copied out first (a backend without dequantize_ranks): bit for bit the
    dequantization of the codes and scales gathered apart, also for a prefix (a padded partition)."""
    parts = [torch.randn(numel, generator=torch.Generator().manual_seed(r)).to(dtype) for r in range(ranks)]
    received, layout, codes, scales = _gathered(parts)
    for count in (ranks * numel, ranks * numel - 5):
        expected = ops.dequantize(codes[:count], scales, dtype, block_numel=numel, backend="torch")
        assert_bitwise(ops.dequantize_packed(received, layout, (count, ), dtype, backend="torch"), expected)


def test_backends_without_in_place_entry_points(monkeypatch):
    """The copies around a backend's plain quantize / dequantize give the same bits."""
    parts = [torch.randn(8001, generator=torch.Generator().manual_seed(r)).to(torch.bfloat16) for r in range(2)]
    received, layout, codes, scales = _gathered(parts)
    expected = ops.dequantize(codes, scales, torch.bfloat16, block_numel=8001, backend="torch")
    plain = types.SimpleNamespace(NAME="torch", quantize=torch_ref.quantize, dequantize=torch_ref.dequantize)
    monkeypatch.setattr(ops, "resolve_backend", lambda name, device: plain)
    ops.forget_signatures()
    try:
        again, _ = ops.quantize_packed(parts[0], backend="torch")
        assert_bitwise(again, codes[:8001].view(again.shape))
        assert_bitwise(ops.dequantize_packed(received, layout, (16002, ), torch.bfloat16, backend="torch"), expected)
    finally:
        ops.forget_signatures()


# Parts of a bucket's packets: a single element, one under and one over a group, zero, the padded rest
PARTS = [(1, 2047, 2049, 0, 3903), (8000, ), (3, 5, 7, 11, 13)]


def _expected_parts(received, layout, parts, dtypes):
    """Each part of every rank, cut out of the whole rows' dequantization in each part's dtype."""
    ranks = received.numel() // layout.nbytes
    outs, at = [], 0
    for part, dtype in zip(parts, dtypes):
        rows = ops.dequantize_packed(received, layout, (ranks, layout.numel), dtype, backend="torch")
        outs.append(rows[:, at:at + part].reshape(-1))
        at += part
    return outs


@pytest.mark.parametrize("parts", PARTS)
@pytest.mark.parametrize("dtype", DTYPES + ["mixed"])
@pytest.mark.parametrize("ranks", [1, 3, 8])
@pytest.mark.parametrize("in_place", [False, True])
def test_dequantize_packed_parts(parts, dtype, ranks, in_place, monkeypatch):
    """A bucket's wait: each part of every rank in its own new buffer of its own dtype, bit for bit the whole rows'
    values, whether the backend writes the parts in place (``dequantize_parts_into``, their column offsets) or the
    bucket is dequantized once and copied per part."""
    monkeypatch.setattr(torch_ref, "WRITES_PARTS", in_place)
    dtypes = [DTYPES[i % 3] if dtype == "mixed" else dtype for i in range(len(parts))]
    numel = max(8001, sum(parts))
    rows = [torch.randn(numel, generator=torch.Generator().manual_seed(r)) * 10.0**r for r in range(ranks)]
    received, layout, _, _ = _gathered([row.to(torch.bfloat16) for row in rows])
    outs = ops.dequantize_packed_parts(received, layout, list(parts), dtypes, backend="torch")
    expected = _expected_parts(received, layout, parts, dtypes)
    assert len(outs) == len(parts)
    for out, want, part, out_dtype in zip(outs, expected, parts, dtypes):
        assert out.dtype == out_dtype and out.numel() == ranks * part
        assert_bitwise(out, want)
    assert len({out.untyped_storage().data_ptr() for out in outs if out.numel()}) == sum(1 for p in parts if p)


def test_bad_parts():
    codes, _ = ops.quantize_packed(torch.randn(300), backend="torch")
    buffer, layout = ops.packet_of(codes).buffer, ops.packet_of(codes).layout
    with pytest.raises(ValueError, match="one dtype per part"):
        ops.dequantize_packed_parts(buffer, layout, [100, 200], [torch.float32])
    with pytest.raises(ValueError, match=r"parts \[200, 101\] are not counts that fit packets of 300"):
        ops.dequantize_packed_parts(buffer, layout, [200, 101], [torch.float32] * 2)
    with pytest.raises(ValueError, match="are not counts"):
        ops.dequantize_packed_parts(buffer, layout, [-1], [torch.float32])
    with pytest.raises(ValueError, match="not packets of"):
        ops.dequantize_packed_parts(buffer[:-16], layout, [300], [torch.float32])
    with pytest.raises(TypeError, match="torch.int32"):
        ops.dequantize_packed_parts(buffer, layout, [300], [torch.int32])
    with pytest.raises(TypeError, match="int8.Packet"):
        ops.dequantize_packed_parts(buffer, (300, 1), [300], [torch.float32])


def test_explicit_equal_groups():
    x = torch.randn(2, 4096)
    codes, scales = ops.quantize_packed(x, groups=4, backend="torch")
    assert scales.numel() == 4 and codes.shape == x.shape
    buffer, layout = ops.packet_of(codes).buffer, ops.packet_of(codes).layout
    received = torch.cat([buffer, buffer])
    expected = ops.dequantize(torch.cat([codes.view(-1)] * 2), torch.cat([scales] * 2), torch.float32, group_size=2048)
    assert_bitwise(ops.dequantize_packed(received, layout, (2, 8192), torch.float32, backend="torch"),
                   expected.view(2, 8192))


def test_bad_packets():
    codes, _ = ops.quantize_packed(torch.randn(300), backend="torch")
    buffer, layout = ops.packet_of(codes).buffer, ops.packet_of(codes).layout
    with pytest.raises(ValueError, match="contiguous 1-D uint8"):
        ops.dequantize_packed(buffer.view(torch.int8), layout, (300, ))
    with pytest.raises(ValueError, match="not packets of"):
        ops.dequantize_packed(buffer[:-16], layout, (300, ))
    with pytest.raises(ValueError, match="not packets of"):
        ops.dequantize_packed(buffer, layout, (301, ))
    with pytest.raises(TypeError, match="int8.Packet"):
        ops.dequantize_packed(buffer, (300, 1), (300, ))
    with pytest.raises(TypeError, match="torch.int32"):
        ops.dequantize_packed(buffer, layout, (300, ), torch.int32)
    with pytest.raises(TypeError, match="torch.int32"):
        ops.quantize_packed(torch.zeros(4, dtype=torch.int32))
    assert ops.packet_of(torch.zeros(3)) is None


class _Work:

    def __init__(self):
        self.waits = 0

    def wait(self):
        self.waits += 1
        return True


class _Sent:
    """A stand-in for DeepSpeed's _dist_allgather_fn: records what each call sends and returns a work handle."""

    def __init__(self):
        self.calls = []

    def __call__(self, input_tensor, output_tensor, group=None):
        self.calls.append((input_tensor, output_tensor))
        return _Work()


@pytest.fixture
def fetch(monkeypatch):
    monkeypatch.setattr(protocol, "readers_patched", lambda: True)
    sent = _Sent()
    return sent, protocol.fetch_allgather(sent)


def test_fetch_sends_one_packet(fetch):
    sent, seam = fetch
    codes, scales = ops.quantize_packed(torch.randn(257, dtype=torch.bfloat16), backend="torch")
    codes_out, scales_out = torch.empty(2 * 257, dtype=torch.int8), torch.empty(2 * scales.numel())
    handle = seam(codes, codes_out)
    assert seam(scales, scales_out) is handle
    (packet, received), = sent.calls
    # upstream's codes receive buffer keeps its shape and views, on the packets' memory (the scales' one, a
    # 1/group_size of it, stays as it is)
    assert codes_out.data_ptr() == received.data_ptr() != scales_out.data_ptr()
    assert codes_out.shape == (514, ) and codes_out.dtype == torch.int8 and scales_out.dtype == torch.float32
    assert codes_out.narrow(0, 0, 300).shape == (300, )
    info = ops.packet_of(codes)
    assert packet is info.buffer and received.dtype == torch.uint8 and received.numel() == 2 * info.layout.nbytes
    handle.wait()
    handle.wait()
    assert handle.work.waits == 1 and type(handle) is protocol.PacketGather
    assert handle.received is received and handle.layout == info.layout


def test_fetch_sends_anything_else_as_upstream(fetch, monkeypatch):
    sent, seam = fetch
    plain = torch.randn(8)
    seam(plain, torch.empty(16))  # not a packet
    codes, scales = ops.quantize_packed(torch.randn(64), backend="torch")
    seam(scales, torch.empty(2))  # scales without their codes before them go on their own
    moved, _ = ops.quantize_packed(torch.randn(64), backend="torch")
    seam(moved.clone(), torch.empty(128, dtype=torch.int8))  # codes off their packet
    later, later_scales = ops.quantize_packed(torch.randn(64), backend="torch")
    seam(later, torch.empty(128, dtype=torch.int8))  # a packet...
    seam(codes, torch.empty(128, dtype=torch.int8))  # ...whose scales do not come next: they go on their own
    seam(later_scales, torch.empty(2))
    assert [call[0] for call in sent.calls[:2]] == [plain, scales] and len(sent.calls) == 6
    assert sent.calls[3][0] is ops.packet_of(later).buffer and sent.calls[5][0] is later_scales
    monkeypatch.setattr(protocol, "readers_patched", lambda: False)
    codes, scales = ops.quantize_packed(torch.randn(64), backend="torch")
    seam(codes, torch.empty(128, dtype=torch.int8))  # the seams that read packets are not there
    seam(scales, torch.empty(2))
    assert [call[0] for call in sent.calls[6:]] == [codes, scales]


def test_packets_only_where_the_handles_read_them():
    from deepspeed_zeropp.patching import apply
    try:
        apply.patch(backend="torch", exclude=["AllGatherHandle.wait"])
        assert not protocol.readers_patched()
        apply.unpatch()
        apply.patch(backend="torch")
        assert protocol.readers_patched()
    finally:
        apply.unpatch()
    assert not protocol.readers_patched()


def test_a_sent_packet_is_freed_without_the_garbage_collector(monkeypatch):
    """The handle (here a work object that holds what it sent, as gloo's does) makes no reference cycle with the
    packet: dropping the fetch's references frees the packet at once."""
    import gc
    import weakref
    monkeypatch.setattr(protocol, "readers_patched", lambda: True)

    class Holding(_Work):

        def __init__(self, sent):
            super().__init__()
            self.sent = sent

    seam = protocol.fetch_allgather(lambda input_tensor, output_tensor, group=None: Holding(input_tensor))
    gc.disable()
    try:
        codes, scales = ops.quantize_packed(torch.randn(1000), backend="torch")
        packet = weakref.ref(ops.packet_of(codes).buffer)
        handle = seam(codes, torch.empty(2000, dtype=torch.int8))
        seam(scales, torch.empty(2 * scales.numel()))
        handle.wait()
        del codes, scales, handle
        assert packet() is None
    finally:
        gc.enable()
