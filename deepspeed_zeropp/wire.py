"""The per-group arithmetic of the wire format that every backend shares.

Symmetric 8-bit as in DeepSpeed's kernel: multiplier = 128 / absmax (1.0 when absmax is 0); stored scale =
1 / multiplier. Two cases DeepSpeed never meets in fp16 are pinned down here:
- absmax below 128 / FLT_MAX (~3.8e-37, fp32/bf16 only): the multiplier is capped at FLT_MAX instead of
  overflowing to inf, so such tiny groups stay finite (values below ~1.5e-39 quantize to 0).
- absmax inf or NaN (the group holds a non-finite value): codes are 0 and the stored scale is NaN, so that
  group, and only that group, dequantizes to NaN. Neighbouring groups are untouched.
"""
import torch

FLT_MAX = torch.finfo(torch.float32).max


def multiplier_from_absmax(absmax):
    """Return (multiplier, stored_scale, finite_mask) for fp32 per-group absolute maxima."""
    # Tensor / tensor on purpose: ``128.0 / t`` is computed as reciprocal(t) * 128, which is not the correctly
    # rounded quotient the CUDA kernels produce.
    finite = torch.isfinite(absmax)
    multiplier = torch.where(absmax == 0, torch.ones_like(absmax), torch.full_like(absmax, 128.0) / absmax)
    multiplier = multiplier.clamp(max=FLT_MAX)
    stored = torch.where(finite, torch.ones_like(multiplier) / multiplier, torch.full_like(absmax, float("nan")))
    return multiplier, stored, finite
