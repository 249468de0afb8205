"""Native CUDA quantizer against the pure-torch reference (bit for bit) and, for fp16, against DeepSpeed's own op."""
import math
import os

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

from deepspeed_zeropp import ops  # noqa: E402
from deepspeed_zeropp.backends import cuda as cuda_backend  # noqa: E402
from deepspeed_zeropp.backends import torch_ref  # noqa: E402
from deepspeed_zeropp.formats.dtypes import SUPPORTED_DTYPES  # noqa: E402
from deepspeed_zeropp.formats.grouping import GatheredLayout, equal_groups, group_layout  # noqa: E402
from tests.helpers import assert_bitwise, extension_builds  # noqa: E402,F401

DTYPES = SUPPORTED_DTYPES
DTYPE_IDS = ("fp16", "bf16", "fp32")
# (numel, groups): single elements, sizes below one 16-byte packet, group sizes that are no multiple of the packet
# (edge elements), primes above DeepSpeed's 16384 limit, the usual ~2-8k groups, and groups too big to keep in
# registers (second pass over the input), up to a prime of ~1M as one group.
SHAPES = [(1, 1), (7, 1), (7, 7), (257, 1), (257, 257), (3000, 1000), (5 * 1001, 5), (7 * 1500, 7), (16 * 2048, 16),
          (16411, 1), (64 * 4096, 64), (8 * 8000, 8), (3 * 12288, 3), (2 * 70001, 2), (100003, 1), (1000003, 1)]


def reference_quantize(x, groups):
    """The reference on the CPU: an independent implementation of the arithmetic, on another processor."""
    codes, scales = torch_ref.quantize(x.cpu().contiguous().view(-1), groups)
    return codes, scales


def random_groups(numel, groups, dtype, seed):
    """Normal values whose groups span six decades of magnitude (kept inside fp16's range)."""
    gen = torch.Generator().manual_seed(seed)
    magnitude = 10.0**(torch.rand(groups, 1, generator=gen, dtype=torch.float64) * 6 - 3)
    values = torch.randn(groups, numel // groups, generator=gen, dtype=torch.float64) * magnitude
    return values.view(-1).to(dtype).cuda()


def edge_groups(dtype, group_size):
    """One group per edge case, each of ``group_size`` elements, built in float64 and rounded to ``dtype`` once."""
    gen = torch.Generator().manual_seed(7)
    info = torch.finfo(dtype)
    noise = lambda: torch.randn(group_size, generator=gen, dtype=torch.float64)  # noqa: E731
    ramp = torch.arange(group_size, dtype=torch.float64)
    cases = [
        torch.zeros(group_size, dtype=torch.float64),
        noise() * 1e-30,
        noise() * 1e-8,
        noise() * 1e-6,
        torch.where(ramp % 3 == 0, info.max, -info.max * torch.rand(group_size, generator=gen, dtype=torch.float64)),
        noise() * info.tiny,  # subnormals (the multiplier is capped at FLT_MAX for fp32/bf16)
        torch.where(ramp == group_size // 2, math.inf, noise()),
        torch.where(ramp == 0, math.nan, noise()),
        torch.where(ramp == group_size - 1, -math.inf, noise()),
        torch.where(ramp % 2 == 0, 1.0, -1.0) * (noise().abs() + 0.5),  # mixed signs
        torch.where(ramp == 0, 128.0, (ramp % 11) - 5.5),  # multiplier 1: exact .5 ties round half to even
        torch.where(ramp == group_size // 3, -3.25, 0.0),  # a single non-zero, negative
        torch.full((group_size, ), -3.7, dtype=torch.float64),
    ]
    return torch.cat(cases).to(dtype).cuda(), len(cases)


@pytest.mark.parametrize("numel,groups", SHAPES, ids=[f"{n}x{g}" for n, g in SHAPES])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_quantize_random_matches_reference(dtype, numel, groups):
    x = random_groups(numel, groups, dtype, seed=numel)
    codes, scales = cuda_backend.quantize(x, groups)
    ref_codes, ref_scales = reference_quantize(x, groups)
    assert codes.device == x.device and scales.shape == (groups, )
    assert_bitwise(codes, ref_codes)
    assert_bitwise(scales, ref_scales)


@pytest.mark.parametrize("group_size", [64, 61, 4096, 20001])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_quantize_edge_values_match_reference(dtype, group_size):
    x, groups = edge_groups(dtype, group_size)
    codes, scales = cuda_backend.quantize(x, groups)
    ref_codes, ref_scales = reference_quantize(x, groups)
    assert_bitwise(codes, ref_codes)
    assert_bitwise(scales, ref_scales)
    # A non-finite value poisons its own group only: codes 0, scale NaN; every other scale is finite.
    assert torch.isnan(scales.cpu()).tolist() == [False] * 6 + [True] * 3 + [False] * (groups - 9)
    assert not codes.view(groups, -1)[6:9].any()


# Groups of more than 4 packets per lane of a warp: the block kernel in one round, of 2 loads per thread up to 256
# packets and of 4 above (quantize.cu); many and few groups an SM, each with group sizes that are and are not a
# multiple of the packet.
LARGE_GROUPS = [(torch.float32, 4096), (torch.float32, 4093), (torch.bfloat16, 8192), (torch.float16, 8190),
                (torch.bfloat16, 2048), (torch.float16, 2046), (torch.float32, 1021)]


@pytest.mark.parametrize("per_sm", [64, 16])
@pytest.mark.parametrize("dtype,group_size", LARGE_GROUPS, ids=[f"{d}-{g}" for d, g in LARGE_GROUPS])
def test_quantize_many_large_groups_match_reference(dtype, group_size, per_sm):
    edges, cases = edge_groups(dtype, group_size)
    groups = per_sm * torch.cuda.get_device_properties(edges.device).multi_processor_count + 3
    numel = groups * group_size - group_size // 3  # and a short last group
    x = edges.repeat(math.ceil(groups / cases))[:numel]
    codes, scales = cuda_backend.quantize(x, groups, group_size)
    ref_codes, ref_scales = torch_ref.quantize(x.cpu(), groups, group_size)
    assert_bitwise(codes, ref_codes)
    assert_bitwise(scales, ref_scales)


# The one-round block kernel uses evict-first cache hints for inputs of up to 64 MiB (kStreamingBytes in
# quantize.cu): inputs of exactly that size and one element more, through both instantiations, in groups of 2 and 4
# loads per thread (the last group short where the size does not divide).
@pytest.mark.parametrize("past", [0, 1], ids=["at", "past"])
@pytest.mark.parametrize("group_size", [2048, 4093])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_quantize_either_side_of_the_cache_hint_size(dtype, group_size, past):
    edges, cases = edge_groups(dtype, group_size)
    numel = (64 << 20) // edges.element_size() + past
    groups = math.ceil(numel / group_size)
    x = edges.repeat(math.ceil(groups / cases))[:numel]
    codes, scales = cuda_backend.quantize(x, groups, group_size)
    ref_codes, ref_scales = torch_ref.quantize(x.cpu(), groups, group_size)
    assert_bitwise(codes, ref_codes)
    assert_bitwise(scales, ref_scales)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_unaligned_and_non_contiguous_input_through_ops(dtype):
    base = random_groups(8 * 4099 + 1, 1, dtype, seed=3)
    misaligned = base[1:]  # 2 or 4 bytes past a 16-byte boundary: the element-wise kernel
    matrix = random_groups(96 * 80, 1, dtype, seed=4).view(96, 80)
    for x in (misaligned, matrix.t(), matrix[:, ::2]):
        groups = 8
        codes, scales = ops.quantize(x, groups, backend="cuda")
        ref_codes, ref_scales = ops.quantize(x.cpu(), groups, backend="torch")
        assert codes.shape == x.shape
        assert_bitwise(codes, ref_codes)
        assert_bitwise(scales, ref_scales)


def test_empty_input():
    codes, scales = ops.quantize(torch.empty(0, device="cuda"), backend="cuda")
    assert codes.numel() == 0 and scales.tolist() == [1.0]
    out = ops.dequantize(codes, scales, dtype=torch.bfloat16, group_size=1, backend="cuda")
    assert out.numel() == 0 and out.dtype == torch.bfloat16


@pytest.mark.parametrize("out_dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_dequantize_matches_reference(dtype, out_dtype):
    for x, groups in (edge_groups(dtype, 61), (random_groups(16 * 4096, 16, dtype, seed=5), 16)):
        codes, scales = cuda_backend.quantize(x, groups)
        layout = equal_groups(x.numel() // groups)
        out = cuda_backend.dequantize(codes, scales, layout, out_dtype)
        expected = torch_ref.dequantize(codes.cpu(), scales.cpu(), layout, out_dtype)
        assert out.dtype == out_dtype
        assert_bitwise(out, expected)


@pytest.mark.parametrize("numel,group_size", [(3500, 1000), (3001, 1000), (15, 4), (1, 1000)])
@pytest.mark.parametrize("out_dtype", DTYPES, ids=DTYPE_IDS)
def test_dequantize_prefix_of_padded_buffer(out_dtype, numel, group_size):
    groups = math.ceil(numel / group_size)
    padded = random_groups(groups * group_size, groups, torch.float32, seed=numel)
    codes, scales = cuda_backend.quantize(padded, groups)
    out = ops.dequantize(codes[:numel], scales, dtype=out_dtype, group_size=group_size, backend="cuda")
    assert_bitwise(out, torch_ref.dequantize(codes.cpu(), scales.cpu(), equal_groups(group_size), out_dtype)[:numel])
    # One byte past the buffer's start (the element-wise kernel); groups then count from that first code.
    shifted = codes[1:numel]
    out = ops.dequantize(shifted, scales, dtype=out_dtype, group_size=group_size, backend="cuda")
    assert_bitwise(out, torch_ref.dequantize(shifted.cpu(), scales.cpu(), equal_groups(group_size), out_dtype))


# Layouts with a short last group (formats/grouping.py): sizes where DeepSpeed's heuristic fails (primes, odd sizes), and
# explicit (numel, groups, group_size) with group sizes that are no multiple of the 16-byte packet.
SHORT_LAST = [(n, *group_layout(n)) for n in (8001, 8581, 16004, 24001, 1000003, 4000001)]
SHORT_LAST += [(200, 4, 61), (61, 4, 16), (17, 2, 9), (9, 5, 2), (100, 2, 99)]


@pytest.mark.parametrize("numel,groups,group_size", SHORT_LAST, ids=[f"{n}={g}x{e}" for n, g, e in SHORT_LAST])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_quantize_short_last_group_matches_reference(dtype, numel, groups, group_size):
    assert (groups - 1) * group_size < numel <= groups * group_size
    x = random_groups(numel, 1, dtype, seed=numel)
    codes, scales = cuda_backend.quantize(x, groups, group_size)
    ref_codes, ref_scales = torch_ref.quantize(x.cpu(), groups, group_size)
    assert codes.shape == (numel, ) and scales.shape == (groups, )
    assert_bitwise(codes, ref_codes)
    assert_bitwise(scales, ref_scales)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_quantize_short_last_group_unaligned_through_ops(dtype):
    """The element-wise kernel (input 2 or 4 bytes past a 16-byte boundary) on the wire layout of a prime size."""
    base = random_groups(1000003 + 1, 1, dtype, seed=23)
    x = base[1:]
    codes, scales = ops.quantize(x, backend="cuda")
    ref_codes, ref_scales = ops.quantize(x.cpu(), backend="torch")
    assert scales.numel() == group_layout(1000003).groups
    assert_bitwise(codes, ref_codes)
    assert_bitwise(scales, ref_scales)


# (block numel, group size) of gathered per-rank blocks: the wire layouts of prime and odd sizes, small groups that
# end several times inside one 16-byte packet, and a group size larger than the block (one group per block).
BLOCKS = [(n, group_layout(n).group_size) for n in (8001, 8581, 24001, 1000003)]
BLOCKS += [(3, 2), (7, 3), (13, 4), (17, 16), (61, 8), (5, 8)]


@pytest.mark.parametrize("block_numel,group_size", BLOCKS, ids=[f"{n}by{e}" for n, e in BLOCKS])
@pytest.mark.parametrize("out_dtype", DTYPES, ids=DTYPE_IDS)
def test_dequantize_gathered_blocks_match_reference(out_dtype, block_numel, group_size):
    """k blocks of n elements, each quantized on its own with a short last group: element i is in group
    (i // n) * G + (i % n) // E. Whole buffers, prefixes (the sequential gather narrows to the parameter) and
    codes one byte past a 16-byte boundary (the element-wise kernel)."""
    groups = -(-block_numel // group_size)
    layout = GatheredLayout(group_size, block_numel)  # the kernel's (group_size, block_numel), one block included
    assert not layout.uniform and layout.block_groups == groups
    for blocks in (1, 2, 3, 5):
        parts = [random_groups(block_numel, 1, torch.float32, seed=17 * blocks + b) for b in range(blocks)]
        quantized = [cuda_backend.quantize(part, groups, group_size) for part in parts]
        codes = torch.cat([c for c, _ in quantized])
        scales = torch.cat([s for _, s in quantized])
        for numel in {codes.numel(), codes.numel() - 1, codes.numel() - block_numel // 2, 1}:
            prefix = codes[:numel]
            out = cuda_backend.dequantize(prefix, scales, layout, out_dtype)
            expected = torch_ref.dequantize(prefix.cpu(), scales.cpu(), layout, out_dtype)
            assert out.dtype == out_dtype
            assert_bitwise(out, expected)
        shifted = torch.cat([codes.new_zeros(1), codes])[1:]  # same values, one byte off the allocation's alignment
        out = cuda_backend.dequantize(shifted, scales, layout, out_dtype)
        assert_bitwise(out, torch_ref.dequantize(codes.cpu(), scales.cpu(), layout, out_dtype))


@pytest.mark.parametrize("out_dtype", DTYPES, ids=DTYPE_IDS)
def test_gathered_prime_partitions_through_ops(out_dtype):
    """What ZeRO-3 hands the quantizer for a prime partition at 4 ranks: ops on CUDA equals ops in pure torch."""
    block_numel = 8581
    parts = [random_groups(block_numel, 1, torch.bfloat16, seed=29 + rank) for rank in range(4)]
    quantized = [ops.quantize(part, backend="cuda") for part in parts]
    codes = torch.cat([c for c, _ in quantized])
    scales = torch.cat([s for _, s in quantized])
    for numel in (codes.numel(), 4 * block_numel - 3):
        out = ops.dequantize(codes[:numel], scales, dtype=out_dtype, block_numel=block_numel, backend="cuda")
        expected = ops.dequantize(codes[:numel].cpu(),
                                  scales.cpu(),
                                  dtype=out_dtype,
                                  block_numel=block_numel,
                                  backend="torch")
        assert_bitwise(out, expected)


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float32), ids=("bf16", "fp32"))
def test_round_trip_finite_up_to_dtype_max(dtype):
    info = torch.finfo(dtype)
    x = random_groups(32 * 4096, 32, torch.float64, seed=11)
    x = (x / x.abs().max() * info.max).to(dtype)  # every group within a few decades of the dtype's max
    assert torch.isfinite(x).all()
    codes, scales = cuda_backend.quantize(x, 32)
    out = cuda_backend.dequantize(codes, scales, equal_groups(4096), dtype)
    assert torch.isfinite(scales).all() and torch.isfinite(out).all()


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float32), ids=("bf16", "fp32"))
def test_tiny_groups_keep_one_percent_accuracy(dtype):
    gen = torch.Generator().manual_seed(13)
    x = (torch.randn(64 * 4096, generator=gen, dtype=torch.float64) * 1e-8).to(dtype).cuda()
    codes, scales = cuda_backend.quantize(x, 64)
    out = cuda_backend.dequantize(codes, scales, equal_groups(4096), torch.float32)
    relative_error = (out - x.float()).norm() / x.float().norm()
    assert relative_error <= 0.01


def test_runs_on_the_current_stream():
    x = random_groups(64 * 4096, 64, torch.bfloat16, seed=17)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        codes, scales = cuda_backend.quantize(x, 64)
        out = cuda_backend.dequantize(codes, scales, equal_groups(4096), torch.bfloat16)
    stream.synchronize()
    ref_codes, ref_scales = reference_quantize(x, 64)
    assert_bitwise(codes, ref_codes)
    assert_bitwise(out, torch_ref.dequantize(ref_codes, ref_scales, equal_groups(4096), torch.bfloat16))


def test_repeated_calls_are_identical():
    x = random_groups(8 * 8000, 8, torch.float16, seed=19)
    first, second = cuda_backend.quantize(x, 8), cuda_backend.quantize(x, 8)
    assert_bitwise(first[0], second[0])
    assert_bitwise(first[1], second[1])


# ---- fp16 against DeepSpeed's own op -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def deepspeed_quantizer():
    """DeepSpeed's compiled quantizer, or skip where DeepSpeed or its build is unavailable."""
    major, minor = torch.cuda.get_device_capability()
    # DeepSpeed cannot parse torch >= 2.11's default arch list ("9.0a"), already at import: name the arch first.
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", f"{major}.{minor}")
    os.environ.setdefault("DS_ACCELERATOR", "cuda")
    pytest.importorskip("deepspeed")
    try:
        from deepspeed.ops.op_builder import QuantizerBuilder
        return QuantizerBuilder().load()
    except Exception as exc:  # a DeepSpeed build problem is not this package's defect
        pytest.skip(f"DeepSpeed's QuantizerBuilder does not load: {exc}")


def ulp_distance(a, b):
    """|a - b| in units in the last place, for finite fp32 tensors of one sign."""
    return (a.view(torch.int32).long() - b.view(torch.int32).long()).abs()


def fp16_cases():
    """fp16 data DeepSpeed's kernel accepts: finite values, group sizes a multiple of 8 and at most 16384."""
    cases = []
    for group_size in (8, 64, 1000, 4096, 8000, 12288, 16384):
        groups = max(1, 2**18 // group_size)
        cases.append((f"random-{group_size}", random_groups(groups * group_size, groups, torch.float16,
                                                            group_size), groups))
    edges, count = edge_groups(torch.float16, 64)
    finite = edges.view(count, -1).isfinite().all(dim=1)
    cases.append(("edges-64", edges.view(count, -1)[finite].reshape(-1).contiguous(), int(finite.sum())))
    return cases


def test_fp16_matches_deepspeed_op(deepspeed_quantizer):
    """Bit for bit, except where DeepSpeed's --use_fast_math division rounds differently (counted, bounded).

    DeepSpeed computes the multiplier 128 / absmax and the stored scale 1 / multiplier with fast-math (approximate
    reciprocal) division; ours rounds both correctly. Each approximate division is within 2 ulp, so its stored scale
    can be up to 3 ulp from ours, and a code can then differ by 1 where x * multiplier lies next to a .5 tie. The
    dequantize kernel is a plain product: on the same codes and scales it must agree exactly."""
    totals = {
        "groups": 0,
        "scale_diff": 0,
        "codes": 0,
        "code_diff": 0,
        "dequant": 0,
        "dequant_diff": 0,
        "max_scale_ulp": 0,
        "max_code_diff": 0
    }
    for name, x, groups in fp16_cases():
        ds_codes, ds_scales = deepspeed_quantizer.quantize(x, groups, 8, deepspeed_quantizer.Symmetric)
        codes, scales = cuda_backend.quantize(x, groups)
        ds_scales = ds_scales.view(-1)
        assert ds_codes.dtype == torch.int8 and ds_scales.dtype == torch.float32
        scale_diff = ulp_distance(scales, ds_scales)
        code_diff = (codes.int() - ds_codes.view(-1).int()).abs()
        # DeepSpeed's dequantize (fp16 out) on our codes and scales: a plain product, expected identical.
        ds_out = deepspeed_quantizer.dequantize(codes, scales.view(-1, 1), groups, 8, deepspeed_quantizer.Symmetric)
        out = cuda_backend.dequantize(codes, scales, equal_groups(x.numel() // groups), torch.float16)
        dequant_diff = int((out.view(torch.int16) != ds_out.view(-1).view(torch.int16)).sum())
        histogram = {int(u): int(c) for u, c in zip(*torch.unique(scale_diff, return_counts=True))}
        print(f"{name}: scale ulp histogram {histogram} of {groups}; codes differing: {int((code_diff != 0).sum())} "
              f"of {x.numel()} (max {int(code_diff.max())}); dequantized differing: {dequant_diff}")
        totals["groups"] += groups
        totals["scale_diff"] += int((scale_diff != 0).sum())
        totals["codes"] += x.numel()
        totals["code_diff"] += int((code_diff != 0).sum())
        totals["dequant"] += x.numel()
        totals["dequant_diff"] += dequant_diff
        totals["max_scale_ulp"] = max(totals["max_scale_ulp"], int(scale_diff.max()))
        totals["max_code_diff"] = max(totals["max_code_diff"], int(code_diff.max()))
    print(f"fp16 vs DeepSpeed op: scales differing: {totals['scale_diff']} of {totals['groups']} "
          f"(max {totals['max_scale_ulp']} ulp); codes differing: {totals['code_diff']} of {totals['codes']} "
          f"(max {totals['max_code_diff']}); dequantized values differing: {totals['dequant_diff']} of "
          f"{totals['dequant']}")
    assert totals["max_scale_ulp"] <= 3 and totals["max_code_diff"] <= 1
    assert totals["dequant_diff"] == 0
