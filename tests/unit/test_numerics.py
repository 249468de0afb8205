"""The pure-torch backend against the naive reference: exact codes, scales and dequantized values."""

import pytest
import torch
from hypothesis import example, given, settings, strategies as st

from deepspeed_zeropp import ops
from deepspeed_zeropp.formats.dtypes import SUPPORTED_DTYPES
from deepspeed_zeropp.formats.grouping import MAX_GROUP_SIZE, GatheredLayout, blocks_of, equal_groups, group_layout
from tests import naive

DTYPES = list(SUPPORTED_DTYPES)
IDS = ["fp16", "bf16", "fp32"]


def assert_bitwise_equal(actual, expected):
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    assert torch.equal(
        actual.view(-1).view(torch.uint8) if actual.dtype != torch.int8 else actual,
        expected.view(-1).view(torch.uint8) if expected.dtype != torch.int8 else expected)


def check_against_naive(x, groups=None):
    """Exact codes, scales and dequantized values; ``groups`` None: the wire layout of x's numel."""
    groups, group_size = group_layout(x.numel()) if groups is None else (groups, None)
    codes, scales = ops.quantize(x, groups, backend="torch")
    ref_codes, ref_scales = naive.quantize(x, groups, group_size)
    assert_bitwise_equal(codes, ref_codes)
    assert torch.equal(scales.isnan(), ref_scales.isnan())
    assert torch.equal(scales.nan_to_num(), ref_scales.nan_to_num())
    for out_dtype in DTYPES:
        out = ops.dequantize(codes, scales, dtype=out_dtype, backend="torch")
        ref = naive.dequantize(ref_codes, ref_scales, out_dtype, group_size)
        assert out.dtype == out_dtype
        assert torch.equal(out.isnan(), ref.isnan()) and torch.equal(out.nan_to_num(), ref.nan_to_num())
    return codes, scales


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("numel", [1, 7, 8, 257, 514, 8000, 8001, 16001, 24000, 65537])
def test_random_matches_naive(dtype, numel):
    torch.manual_seed(numel)
    check_against_naive(torch.randn(numel).to(dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_idempotent(dtype):
    x = torch.randn(4096).to(dtype)
    first = ops.quantize(x, backend="torch")
    second = ops.quantize(x, backend="torch")
    assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1])
    assert torch.equal(ops.dequantize(*first, dtype=dtype), ops.dequantize(*second, dtype=dtype))


def test_dequantize_defaults_to_fp16_and_honours_dtype():
    codes, scales = ops.quantize(torch.randn(64, dtype=torch.bfloat16))
    assert ops.dequantize(codes, scales).dtype == torch.float16
    assert ops.dequantize(codes, scales, dtype=torch.bfloat16).dtype == torch.bfloat16
    assert ops.dequantize(codes, scales.view(-1, 1), dtype=torch.float32).dtype == torch.float32


def test_scales_are_one_dimensional_fp32():
    codes, scales = ops.quantize(torch.randn(3, 5000, dtype=torch.bfloat16))
    assert codes.dtype == torch.int8 and codes.shape == (3, 5000)
    assert scales.dtype == torch.float32 and scales.dim() == 1 and scales.numel() == group_layout(15000).groups


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("magnitude", [1e-8, 1e-6, 1e5, 3e38])
def test_no_fp16_range_loss(dtype, magnitude):
    """Values fp16 cannot hold (above 65504, below ~6e-8) survive with the int8 step as the only error."""
    magnitude = min(magnitude, torch.finfo(dtype).max / 2)
    x = (torch.rand(4096) * 2 - 1).to(dtype) * magnitude
    codes, scales = ops.quantize(x)
    out = ops.dequantize(codes, scales, dtype=dtype)
    assert torch.isfinite(out).all()
    error = (out.float() - x.float()).abs().max() / x.float().abs().max()
    assert error <= 1 / 128 + 2**-8  # a full step at +absmax (code 128 clamps to 127), plus bf16 rounding


def test_non_finite_values_only_poison_their_group():
    x = torch.randn(4 * 2000, dtype=torch.bfloat16)
    x[2000 + 5] = float("inf")
    x[3 * 2000 + 9] = float("nan")
    codes, scales = ops.quantize(x, 4)
    out = ops.dequantize(codes, scales, dtype=torch.bfloat16)
    assert torch.isnan(scales).tolist() == [False, True, False, True]
    assert out[2000:4000].isnan().all() and out[6000:].isnan().all()
    clean = ops.quantize(x[:2000], 1)
    assert torch.equal(codes[:2000], clean[0]) and scales[0] == clean[1][0]
    assert torch.isfinite(out[:2000]).all() and torch.isfinite(out[4000:6000]).all()


def test_zero_group_has_unit_scale():
    codes, scales = ops.quantize(torch.zeros(16, dtype=torch.float32), 2)
    assert scales.tolist() == [1.0, 1.0] and codes.eq(0).all()


def test_empty_tensor():
    codes, scales = ops.quantize(torch.empty(0, dtype=torch.bfloat16))
    assert codes.numel() == 0 and scales.tolist() == [1.0]
    assert ops.dequantize(codes, scales, dtype=torch.bfloat16).numel() == 0


def test_non_contiguous_input():
    base = torch.randn(64, 96, dtype=torch.bfloat16)
    view = base.t()[::2]
    codes, scales = ops.quantize(view)
    ref_codes, ref_scales = ops.quantize(view.contiguous())
    assert codes.shape == view.shape and torch.equal(codes, ref_codes) and torch.equal(scales, ref_scales)


def test_prefix_of_padded_buffer():
    """Codes that are the first n elements of a padded gathered buffer dequantize with the buffer's group size."""
    x = torch.randn(2 * 300, dtype=torch.float32)
    codes, scales = ops.quantize(x, 4)
    prefix = ops.dequantize(codes[:533], scales, dtype=torch.float32, group_size=150)
    assert torch.equal(prefix, ops.dequantize(codes, scales, dtype=torch.float32)[:533])


magnitudes = st.sampled_from([1e-30, 1e-20, 1e-8, 1e-4, 1.0, 1e4, 6e4, 1e30, 3e38])


@settings(max_examples=3000, deadline=None)
@given(dtype=st.sampled_from(DTYPES),
       groups=st.integers(1, 8),
       group_size=st.integers(1, 40),
       magnitude=magnitudes,
       signs=st.sampled_from(["mixed", "positive", "negative", "zeros"]),
       seed=st.integers(0, 2**31 - 1))
def test_property_formula_and_bound(dtype, groups, group_size, magnitude, signs, seed):
    generator = torch.Generator().manual_seed(seed)
    magnitude = min(magnitude, torch.finfo(dtype).max)
    base = torch.rand(groups * group_size, generator=generator, dtype=torch.float64)
    if signs == "mixed":
        base = base * 2 - 1
    elif signs == "negative":
        base = -base
    elif signs == "zeros":
        base = torch.zeros_like(base)
    x = (base * magnitude).to(dtype)
    codes, scales = check_against_naive(x, groups)
    out = ops.dequantize(codes, scales, dtype=dtype).double().view(groups, -1)
    x64 = x.double().view(groups, -1)
    absmax = x64.abs().amax(dim=1, keepdim=True)
    tiny = torch.finfo(dtype).tiny
    # an int8 step of the group's absmax (half a step, except +absmax itself whose code 128 clamps to 127),
    # the output dtype's rounding, and denormal flushing near zero
    bound = absmax / 128 * (1 + 1e-6) + x64.abs() * torch.finfo(dtype).eps + 2 * tiny
    assert torch.isfinite(out).all()
    assert ((out - x64).abs() <= bound).all(), (out - x64).abs().max().item()


def test_dequantize_segments_of_separately_quantized_partitions():
    """A MixZ++ bucket: partitions quantized one by one (different layouts, some with a short last group),
    concatenated, twice (2 ranks)."""
    parts = [torch.randn(n, dtype=torch.bfloat16) for n in (514, 8192, 16000, 7, 16001, 16001, 0, 24000)]
    quantized = [ops.quantize(p) for p in parts]
    codes = torch.cat([c for c, _ in quantized] * 2)
    scales = torch.cat([s for _, s in quantized] * 2)
    segments = [p.numel() for p in parts] * 2
    out = ops.dequantize_segments(codes, scales, segments, dtype=torch.bfloat16)
    expected = torch.cat([ops.dequantize(c, s, dtype=torch.bfloat16) for c, s in quantized] * 2)
    assert out.dtype == torch.bfloat16 and torch.equal(out, expected)
    with pytest.raises(ValueError, match="do not cover"):
        ops.dequantize_segments(codes, scales, segments[:-1], dtype=torch.bfloat16)


def with_outliers(numel, dtype, outliers, magnitude, seed):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(numel, generator=generator, dtype=torch.float64)
    where = torch.randint(0, numel, (outliers, ), generator=generator)
    x[where] = magnitude * torch.where(torch.rand(outliers, generator=generator) < 0.5, -1.0, 1.0).double()
    return x.to(dtype)


def assert_group_bound(x, out, groups, group_size):
    """Per group of the layout, in float64: an int8 step of the group's own absmax, plus the dtype's rounding."""
    pad = groups * group_size - x.numel()
    x64 = torch.nn.functional.pad(x.double(), (0, pad)).view(groups, group_size)
    out64 = torch.nn.functional.pad(out.double(), (0, pad)).view(groups, group_size)
    absmax = x64.abs().amax(dim=1, keepdim=True)
    bound = absmax / 128 * (1 + 1e-6) + x64.abs() * torch.finfo(x.dtype).eps + 2 * torch.finfo(x.dtype).tiny
    assert ((out64 - x64).abs() <= bound).all(), (out64 - x64).abs().max().item()


@settings(max_examples=40, deadline=None)
@given(numel=st.integers(1, 7).flatmap(lambda digits: st.integers(10**(digits - 1), 10**digits)),
       dtype=st.sampled_from(DTYPES),
       outliers=st.integers(0, 5),
       magnitude=st.sampled_from([20.0, 200.0, 6e4]),
       seed=st.integers(0, 2**31 - 1))
@example(numel=1000003, dtype=torch.float32, outliers=1, magnitude=200.0, seed=0)
@example(numel=10**7 - 1, dtype=torch.bfloat16, outliers=5, magnitude=6e4, seed=1)
def test_property_any_size_bounded_groups_and_error(numel, dtype, outliers, magnitude, seed):
    """Sizes from 1 to 10^7 (as many of each number of digits) with a few outliers: groups of at most 16,000
    elements, exact agreement with the naive reference in the same layout, each group's error within a step of
    its own absmax."""
    x = with_outliers(numel, dtype, min(outliers, numel), magnitude, seed)
    groups, group_size = group_layout(numel)
    assert group_size <= MAX_GROUP_SIZE and (groups - 1) * group_size < numel <= groups * group_size
    codes, scales = ops.quantize(x, backend="torch")
    ref_codes, ref_scales = naive.quantize(x, groups, group_size)
    assert torch.equal(codes, ref_codes) and torch.equal(scales, ref_scales)
    out = ops.dequantize(codes, scales, dtype=dtype, backend="torch")
    assert torch.equal(out, naive.dequantize(ref_codes, ref_scales, dtype, group_size))
    assert_group_bound(x, out, groups, group_size)


def test_prime_size_with_an_outlier_keeps_its_accuracy():
    """1,000,003 elements (prime) and one outlier of 200: one group of the whole tensor would flush most values to
    0 (56.6% of them, 44% RMS error); bounded groups confine the outlier to its own group."""
    x = torch.randn(1000003, generator=torch.Generator().manual_seed(0), dtype=torch.float32)
    x[123457] = 200.0
    codes, scales = ops.quantize(x, backend="torch")
    out = ops.dequantize(codes, scales, dtype=torch.float32, backend="torch")
    assert scales.numel() == group_layout(1000003).groups > 100
    assert (x.numel() + scales.numel() - 1) // scales.numel() <= MAX_GROUP_SIZE
    rms_error = ((out - x).pow(2).mean() / x.pow(2).mean()).sqrt().item()
    assert rms_error < 0.05, rms_error  # the outlier's own group of ~8000 values loses them
    assert (out == 0).float().mean().item() < 0.02


@pytest.mark.parametrize("block_numel", [257, 16001, 1000003, 24000])
@pytest.mark.parametrize("blocks", [1, 2, 3])
def test_gathered_blocks_each_with_its_own_short_last_group(blocks, block_numel):
    """ZeRO-3 all-gathers one block per rank, each quantized on its own (a short last group each): element i is in
    group (i // n) * G + (i % n) // E. The gathered buffer, and its prefix (the sequential path narrows it to the
    parameter's numel), dequantize as the blocks would one by one."""
    parts = [with_outliers(block_numel, torch.bfloat16, 3, 200.0, seed) for seed in range(blocks)]
    quantized = [ops.quantize(p, backend="torch") for p in parts]
    codes = torch.cat([c for c, _ in quantized])
    scales = torch.cat([s for _, s in quantized])
    expected = torch.cat([ops.dequantize(c, s, dtype=torch.bfloat16, backend="torch") for c, s in quantized])
    groups, group_size = group_layout(block_numel)
    for numel in (codes.numel(), codes.numel() - block_numel // 2):
        out = ops.dequantize(codes[:numel], scales, dtype=torch.bfloat16, block_numel=block_numel, backend="torch")
        assert torch.equal(out, expected[:numel])
        reference = naive.dequantize(codes[:numel], scales, torch.bfloat16, group_size, block_numel)
        assert torch.equal(out, reference)
    with pytest.raises(ValueError, match="not blocks of"):
        ops.dequantize(torch.cat([codes, codes[:1]]), scales, block_numel=block_numel, backend="torch")
    for numel in (codes.numel(), codes.numel() - block_numel // 2):  # a seam's layout, handed in as it is
        gathered = ops.dequantize_gathered(codes[:numel], scales, blocks_of(block_numel), torch.bfloat16, "torch")
        assert torch.equal(gathered, expected[:numel])
    with pytest.raises(ValueError, match="do not fit GatheredLayout"):
        ops.dequantize_gathered(torch.cat([codes, codes[:1]]), scales, blocks_of(block_numel), backend="torch")


def test_dequantize_gathered_passes_its_layout_unchanged(monkeypatch):
    """ops hands the backend the GatheredLayout it was given (one block: read as equal groups), checked once per
    call signature; anything but a GatheredLayout of positive ints is refused."""
    from deepspeed_zeropp.backends import torch_ref
    parts = [torch.randn(8581, generator=torch.Generator().manual_seed(seed)) for seed in range(2)]
    quantized = [ops.quantize(p, backend="torch") for p in parts]
    codes, scales = torch.cat([c for c, _ in quantized]), torch.cat([s for _, s in quantized])
    seen, real = [], torch_ref.dequantize

    def recording(codes, scales, layout, dtype):
        seen.append(layout)
        return real(codes, scales, layout, dtype)

    monkeypatch.setattr(torch_ref, "dequantize", recording)
    ops.forget_signatures()
    layout = blocks_of(8581)
    first = ops.dequantize_gathered(codes, scales, layout, torch.float32, "torch")
    assert torch.equal(ops.dequantize_gathered(codes, scales, layout, torch.float32, "torch"), first)
    assert seen == [layout, layout] and seen[0] is layout
    ops.dequantize_gathered(codes[:8581], scales[:group_layout(8581).groups], layout, torch.float32, "torch")
    assert seen[-1] == equal_groups(layout.group_size)
    ops.forget_signatures()
    for bad in ((layout.group_size, 8581), GatheredLayout(0, None), GatheredLayout(4304.0, 8581), 8581):
        with pytest.raises(TypeError, match="GatheredLayout of positive ints"):
            ops.dequantize_gathered(codes, scales, bad, torch.float32, "torch")
