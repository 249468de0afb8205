"""qgZ's 4-bit codec against a naive per-element reference (numpy float32), exact."""
import numpy as np
import pytest
import torch

from deepspeed_zeropp.qgz_wire import GROUP, dequantize_int4, quantize_int4


def naive(values):
    out = np.zeros(values.size, dtype=np.float32)
    for start in range(0, values.size, GROUP):
        chunk = values[start:start + GROUP].astype(np.float32)
        m = np.float32(np.abs(chunk).max())
        mult = np.float32(1) if m == 0 else np.float32(8) / m
        codes = np.clip(np.rint(chunk * mult), -8, 7).astype(np.float32)
        out[start:start + GROUP] = codes * (np.float32(1) / mult)
    return out


@pytest.mark.parametrize("scale", [1e-30, 1e-3, 1.0, 1e6, 1e30])
def test_round_trip_matches_naive(scale):
    torch.manual_seed(0)
    values = torch.randn(8 * GROUP) * scale
    values[:GROUP] = 0
    packed, scales = quantize_int4(values)
    assert packed.dtype == torch.uint8 and packed.numel() == values.numel() // 2 and scales.numel() == 8
    out = dequantize_int4(packed, scales)
    assert torch.equal(out, torch.from_numpy(naive(values.numpy())))
    bound = values.view(-1, GROUP).abs().amax(1).repeat_interleave(GROUP) / 8 * (1 + 1e-6)
    assert ((out - values).abs() <= bound).all()  # one step at most: +absmax itself clamps from 8 to 7


def test_non_finite_group_stays_in_its_group():
    values = torch.randn(3 * GROUP)
    values[GROUP + 3] = float("inf")
    out = dequantize_int4(*quantize_int4(values))
    assert out[GROUP:2 * GROUP].isnan().all() and torch.isfinite(out[:GROUP]).all() and torch.isfinite(
        out[2 * GROUP:]).all()
