"""Packets on the CUDA backend: quantize writes into the packet's views and the gathered packets are dequantized in
place, each one kernel, bit for bit the torch reference's values (docs/numerics.md, "Packets")."""
import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

from deepspeed_zeropp import ops  # noqa: E402
from tests.helpers import assert_bitwise, extension_builds  # noqa: E402,F401

DTYPES = [torch.float16, torch.bfloat16, torch.float32]
# Per-rank sizes: below a 16-byte packet, odd (rows whose output is not 16-byte aligned), a multiple of 8 with groups
# of a multiple of 8 (the vector path), a short last group, and groups of a size that is no multiple of 8.
SIZES = [1, 7, 257, 8000, 8001, 16000, 24576, 40000, 100003]


def _parts(numel, ranks, dtype):
    gen = torch.Generator().manual_seed(numel + ranks)
    magnitude = 10.0**(torch.rand(ranks, 1, generator=gen) * 4 - 2)
    return [(torch.randn(numel, generator=gen) * magnitude[r]).to(dtype).cuda() for r in range(ranks)]


def _gathered(parts, backend):
    packed = [ops.quantize_packed(part, backend=backend) for part in parts]
    return torch.cat([ops.packet_of(codes).buffer for codes, _ in packed]), ops.packet_of(packed[0][0]).layout


@pytest.mark.parametrize("numel", SIZES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("ranks", [1, 3])
def test_packets_match_the_torch_reference(numel, dtype, ranks):
    parts = _parts(numel, ranks, dtype)
    received, layout = _gathered(parts, "cuda")
    expected_received, expected_layout = _gathered([part.cpu() for part in parts], "torch")
    assert layout == expected_layout
    for r in range(ranks):  # codes and scales; the padding between them is never read
        row, expected = received.view(ranks, -1)[r].cpu(), expected_received.view(ranks, -1)[r]
        assert_bitwise(row[:layout.numel], expected[:layout.numel])
        scales = slice(layout.scales_at, layout.scales_at + 4 * layout.groups)
        assert_bitwise(row[scales], expected[scales])
    for out_dtype in DTYPES:
        for count in {ranks * numel, max(1, ranks * numel - 5), numel}:
            values = ops.dequantize_packed(received, layout, (count, ), out_dtype, backend="cuda")
            expected = ops.dequantize_packed(expected_received, layout, (count, ), out_dtype, backend="torch")
            assert values.dtype == out_dtype and values.is_cuda
            assert_bitwise(values.cpu(), expected)


def test_rows_of_a_gather_at_an_offset():
    """Rows read through views of a larger buffer (the packets start 16 bytes in), with their own scales."""
    parts = _parts(8001, 2, torch.bfloat16)
    received, layout = _gathered(parts, "cuda")
    shifted = torch.empty(received.numel() + 16, dtype=torch.uint8, device="cuda")
    shifted[16:].copy_(received)
    assert_bitwise(
        ops.dequantize_packed(shifted[16:], layout, (16002, ), torch.bfloat16, backend="cuda").cpu(),
        ops.dequantize_packed(received, layout, (16002, ), torch.bfloat16, backend="cuda").cpu())


def test_one_kernel_each_way():
    """A packet costs the quantize kernel alone, and a gather of packets the dequantize kernel alone: no copies."""
    parts = _parts(8001, 4, torch.bfloat16)
    received, layout = _gathered(parts, "cuda")
    ops.dequantize_packed(received, layout, (32000, ), torch.bfloat16, backend="cuda")
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
        ops.quantize_packed(parts[0], backend="cuda")
        ops.dequantize_packed(received, layout, (32000, ), torch.bfloat16, backend="cuda")
        torch.cuda.synchronize()
    kernels = [event.name for event in profile.events() if event.device_type == torch.autograd.DeviceType.CUDA]
    assert len(kernels) == 2, kernels


# Parts of a bucket's packets (a bucket's wait, ops.dequantize_packed_parts): unaligned starts and sizes, a single
# element, zero, parts that start on and off a group or a 16-byte packet, and the padded rest.
PARTS = [(1, 7, 2047, 2049, 0, 3897), (8000, 16000, 16000), (8, 16, 24, 4096, 100)]


@pytest.mark.parametrize("parts", PARTS)
@pytest.mark.parametrize("out_dtype", DTYPES + ["mixed"])
@pytest.mark.parametrize("ranks", [1, 3])
@pytest.mark.parametrize("in_place", [True, False])
def test_parts_match_the_torch_reference(parts, out_dtype, ranks, in_place, monkeypatch):
    """A bucket's wait on the native backend, its parts written in place (``WRITES_PARTS``: ``dequantize_parts_into``,
    every part's column offset) or dequantized once and copied: bit for bit the torch reference."""
    from deepspeed_zeropp.backends import cuda
    monkeypatch.setattr(cuda, "WRITES_PARTS", in_place)
    dtypes = [DTYPES[i % 3] if out_dtype == "mixed" else out_dtype for i in range(len(parts))]
    tensors = _parts(sum(parts) + 5, ranks, torch.bfloat16)
    received, layout = _gathered(tensors, "cuda")
    expected_received, _ = _gathered([t.cpu() for t in tensors], "torch")
    outs = ops.dequantize_packed_parts(received, layout, list(parts), dtypes, backend="cuda")
    expected = ops.dequantize_packed_parts(expected_received, layout, list(parts), dtypes, backend="torch")
    for out, want, dtype in zip(outs, expected, dtypes):
        assert out.is_cuda and out.dtype == dtype
        assert_bitwise(out.cpu(), want)


def _kernels_of(fn):
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
        fn()
        torch.cuda.synchronize()
    return [event.name for event in profile.events() if event.device_type == torch.autograd.DeviceType.CUDA]


@pytest.mark.parametrize("count, kernels", [(1, 1), (3, 1), (16, 1), (17, 2), (40, 3)])
def test_a_bucket_costs_one_kernel_per_16_parts(count, kernels):
    """In place, a bucket's parts of one dtype that start on 16-byte boundaries cost one kernel for every 16 (no
    dequantize of the whole bucket, no copies), and their values are the torch reference's."""
    parts, dtypes = [64 * (i % 5 + 1) for i in range(count)], [torch.bfloat16] * count
    tensors = _parts(sum(parts), 4, torch.bfloat16)
    received, layout = _gathered(tensors, "cuda")
    expected_received, _ = _gathered([t.cpu() for t in tensors], "torch")
    launched = _kernels_of(lambda: ops.dequantize_packed_parts(received, layout, parts, dtypes, backend="cuda"))
    assert len(launched) == kernels, launched
    outs = ops.dequantize_packed_parts(received, layout, parts, dtypes, backend="cuda")
    for out, want in zip(outs, ops.dequantize_packed_parts(expected_received, layout, parts, dtypes, "torch")):
        assert_bitwise(out.cpu(), want)


def test_parts_past_the_rows_limit():
    """More ranks than one kernel reads rows (``cuda.ROWS_LIMIT``): the parts are written in slices of rows."""
    from deepspeed_zeropp.backends import cuda
    ranks = cuda.ROWS_LIMIT + 3
    parts, dtypes = [5, 11], [torch.float32, torch.bfloat16]
    tensor = torch.randn(16, generator=torch.Generator().manual_seed(0))
    codes, _ = ops.quantize_packed(tensor, backend="torch")
    info = ops.packet_of(codes)
    received = info.buffer.repeat(ranks)
    outs = ops.dequantize_packed_parts(received.cuda(), info.layout, parts, dtypes, backend="cuda")
    expected = ops.dequantize_packed_parts(received, info.layout, parts, dtypes, backend="torch")
    for out, want in zip(outs, expected):
        assert_bitwise(out.cpu(), want)


# Many partitions quantized at once (ops.quantize_packed_many, the batch a forward's first fetch makes): every size
# above, each dtype, inputs and codes that are not 16-byte aligned (a second kernel), past MAX_SEGMENTS (more calls).
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("offset", [0, 1])
def test_many_packets_match_one_by_one(dtype, offset):
    gen = torch.Generator().manual_seed(11)
    sizes = SIZES + [2 * 70001, 64 * 4096, 3 * 12288]  # and groups of ours and DeepSpeed's sizes
    flat = (torch.randn(sum(sizes) + offset, generator=gen) * 5).to(dtype).cuda()
    xs = list(flat[offset:].split(sizes))
    many = ops.quantize_packed_many(xs, backend="cuda")
    for x, (codes, scales) in zip(xs, many):
        want_codes, want_scales = ops.quantize_packed(x.cpu(), backend="torch")
        assert codes.shape == x.shape and ops.packet_of(codes) is ops.packet_of(scales)
        assert_bitwise(codes.cpu(), want_codes)
        assert_bitwise(scales.cpu(), want_scales)
        assert ops.packet_of(codes).layout == ops.packet_of(want_codes).layout


@pytest.mark.parametrize("count, kernels", [(1, 1), (32, 1), (33, 2), (100, 4)])
def test_many_partitions_cost_one_kernel_per_32(count, kernels):
    """Aligned partitions of one dtype: one kernel for every MAX_SEGMENTS, instead of one each."""
    from deepspeed_zeropp.backends import cuda as cuda_backend
    assert cuda_backend.MAX_SEGMENTS == cuda_backend._extension().MAX_SEGMENTS == 32
    xs = [t.view(-1) for t in torch.randn(count, 4096, device="cuda", dtype=torch.bfloat16).unbind()]
    launched = _kernels_of(lambda: ops.quantize_packed_many(xs, backend="cuda"))
    assert len(launched) == kernels, launched


def test_many_rejects_what_one_call_cannot_take():
    from deepspeed_zeropp.backends import cuda as cuda_backend
    extension = cuda_backend._extension()
    xs = [torch.zeros(16, device="cuda", dtype=torch.bfloat16), torch.zeros(16, device="cuda")]
    codes = [torch.empty(16, dtype=torch.int8, device="cuda") for _ in xs]
    scales = [torch.empty(1, device="cuda") for _ in xs]
    with pytest.raises(RuntimeError, match="first input's dtype"):
        extension.quantize_many_into(xs, [1, 1], [16, 16], codes, scales)
    with pytest.raises(RuntimeError, match="at most 32 inputs"):
        extension.quantize_many_into(xs[:1] * 33, [1] * 33, [16] * 33, codes[:1] * 33, scales[:1] * 33)
    with pytest.raises(RuntimeError, match="one group count"):
        extension.quantize_many_into(xs, [1], [16, 16], codes, scales)
