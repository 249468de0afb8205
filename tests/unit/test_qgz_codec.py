"""qgZ's 4-bit codec against a naive per-element reference (numpy float32), exact; and its rounding: at most half a
step, unbiased, and exact for the group's extremes."""
import numpy as np
import pytest
import torch

from deepspeed_zeropp.formats.int4 import GROUP, MIN_SCALE, dequantize_int4, quantize_int4


def naive(values):
    out = np.zeros(values.size, dtype=np.float32)
    step = np.float32(1) / np.float32(7)
    for start in range(0, values.size, GROUP):
        chunk = values[start:start + GROUP].astype(np.float32)
        scale = max(np.float32(np.abs(chunk).max()), np.float32(MIN_SCALE))
        codes = np.clip(np.rint(chunk * (np.float32(7) / scale)), -7, 7).astype(np.float32)
        out[start:start + GROUP] = (codes * step) * scale
    return out


def half_step(values):
    """Half a step of each value's group: max(absmax, MIN_SCALE) / 14, widened by fp32's decode rounding."""
    scale = values.view(-1, GROUP).abs().amax(1).clamp(min=MIN_SCALE)
    return (scale / 14 * (1 + 1e-6)).repeat_interleave(GROUP)


@pytest.mark.parametrize("scale", [1e-40, 1e-38, 1e-30, 1e-3, 1.0, 1e6, 1e30])
def test_round_trip_matches_naive(scale):
    torch.manual_seed(0)
    values = torch.randn(8 * GROUP) * scale
    values[:GROUP] = 0
    packed, scales = quantize_int4(values)
    assert packed.dtype == torch.uint8 and packed.numel() == values.numel() // 2 and scales.numel() == 8
    out = dequantize_int4(packed, scales)
    assert torch.equal(out, torch.from_numpy(naive(values.numpy())))
    assert ((out - values).abs() <= half_step(values)).all()


def test_codes_are_symmetric_and_never_minus_eight():
    values = torch.cat([torch.linspace(-1, 1, GROUP), -torch.linspace(-1, 1, GROUP)])
    packed, _ = quantize_int4(values)
    nibbles = torch.stack([packed & 0xF, packed >> 4], dim=-1).reshape(-1)
    codes = torch.where(nibbles >= 8, nibbles.int() - 16, nibbles.int())
    assert codes.min() == -7 and codes.max() == 7 and sorted(codes.unique().tolist()) == list(range(-7, 8))
    assert torch.equal(codes[:GROUP], -codes[GROUP:])


def test_group_extremes_decode_exactly():
    """A group of equal magnitudes (a constant gradient, or +-c) comes back unchanged, for any magnitude from
    MIN_SCALE to fp32's max: +-absmax are levels, and (7 * STEP) * absmax rounds to absmax."""
    gen = torch.Generator().manual_seed(0)
    magnitudes = torch.cat([
        torch.tensor([1.0, 0.1, 0.3, 3.0, 1e-20, MIN_SCALE,
                      torch.finfo(torch.float32).max]),
        2.0**torch.randint(-120, 120, (400, ), generator=gen) * (1 + torch.rand(400, generator=gen))
    ])
    signs = torch.where(torch.rand(magnitudes.numel(), GROUP, generator=gen) < 0.5, -1.0, 1.0)
    signs[:, 0] = 1.0
    values = torch.cat([magnitudes.unsqueeze(1).expand(-1, GROUP), signs * magnitudes.unsqueeze(1)]).reshape(-1)
    assert torch.equal(dequantize_int4(*quantize_int4(values)), values)


def test_rounding_is_unbiased_within_half_a_step():
    """Over many random groups the mean error is ~0 (a clamp of +absmax to a lower code would pull it down by
    ~absmax / 2700 here) and no value errs by more than half a step."""
    values = torch.randn(1 << 21, generator=torch.Generator().manual_seed(1))
    error = dequantize_int4(*quantize_int4(values)) - values
    assert (error.abs() <= half_step(values)).all()
    scale = values.view(-1, GROUP).abs().amax(1).mean()
    assert abs(error.double().mean().item()) / scale < 1e-4


def test_non_finite_group_stays_in_its_group():
    values = torch.randn(3 * GROUP)
    values[GROUP + 3] = float("inf")
    out = dequantize_int4(*quantize_int4(values))
    assert out[GROUP:2 * GROUP].isnan().all() and torch.isfinite(out[:GROUP]).all() and torch.isfinite(
        out[2 * GROUP:]).all()


def test_empty_input():
    packed, scales = quantize_int4(torch.empty(0))
    assert packed.shape == (0, ) and scales.shape == (0, )
    assert dequantize_int4(packed, scales).shape == (0, )
