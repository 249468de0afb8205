"""The 8-bit weight wire (qwZ, MixZ++): the per-group arithmetic every backend shares (docs/numerics.md).

Symmetric 8-bit as in DeepSpeed's kernel: multiplier = 128 / absmax (1.0 when absmax is 0); stored scale =
1 / multiplier; codes = round-half-even(value * multiplier) clamped to [-128, 127]. Two cases DeepSpeed never meets
in fp16 are pinned down here:
- absmax below 128 / FLT_MAX (~3.8e-37, fp32/bf16 only): the multiplier is capped at FLT_MAX instead of
  overflowing to inf, so such tiny groups stay finite (values below ~1.5e-39 quantize to 0).
- absmax inf or NaN (the group holds a non-finite value): codes are 0 and the stored scale is NaN, so that
  group, and only that group, dequantizes to NaN. Neighbouring groups are untouched.

Which elements form a group is the layout rule of :func:`layout` (``grouping.group_layout``), a pure function of
the buffer's element count. What a rank sends in one all-gather is a :func:`packet` of its codes and scales.
"""
from typing import NamedTuple

import torch

from .grouping import GatheredLayout, Layout, blocks_of
from .grouping import group_layout as layout  # noqa: F401  (the wire's group layout, a function of numel)

FLT_MAX = torch.finfo(torch.float32).max
LEVELS = 128  # the multiplier's numerator: absmax maps to code 128, clamped to CODE_MAX
CODE_MIN, CODE_MAX = -128, 127


def multiplier_from_absmax(absmax, out=None):
    """Return (multiplier, stored_scale, finite_mask) for fp32 per-group absolute maxima; the stored scales are
    written into ``out`` when given (fp32, one per group)."""
    # Tensor / tensor on purpose: ``128.0 / t`` is computed as reciprocal(t) * 128, which is not the correctly
    # rounded quotient the CUDA kernels produce.
    finite = torch.isfinite(absmax)
    multiplier = torch.where(absmax == 0, torch.ones_like(absmax), torch.full_like(absmax, float(LEVELS)) / absmax)
    multiplier = multiplier.clamp(max=FLT_MAX)
    stored = torch.where(finite,
                         torch.ones_like(multiplier) / multiplier,
                         torch.full_like(absmax, float("nan")),
                         out=out)
    return multiplier, stored, finite


# --- The packet: one rank's codes and scales in one byte buffer, so that one all-gather carries both ---------------

PACKET_ALIGNMENT = 16  # bytes: the scales and the next rank's packet start on a multiple of it
SCALE_BYTES = 4  # one fp32 scale


class Packet(NamedTuple):
    """Where the parts of a packet of ``numel`` codes in ``groups`` groups of ``group_size`` lie, in bytes: the
    codes at 0, the scales at ``scales_at``, ``nbytes`` in all (the stride between ranks in a gathered buffer).
    ``gathered``: the group layout of a gather of such packets' codes, one block of ``numel`` per rank (what the
    backends dequantize them in)."""
    numel: int
    groups: int
    group_size: int
    scales_at: int
    nbytes: int
    gathered: GatheredLayout


def _aligned(nbytes):
    return -(-nbytes // PACKET_ALIGNMENT) * PACKET_ALIGNMENT


def packet(numel, groups, group_size):
    """The packet of ``numel`` codes in ``groups`` groups of ``group_size`` elements (the quantizer's layout)."""
    scales_at = _aligned(numel)
    return Packet(numel, groups, group_size, scales_at, _aligned(scales_at + SCALE_BYTES * groups),
                  blocks_of(numel, Layout(groups, group_size)))
