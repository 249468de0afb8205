"""Pure-torch quantizer: the reference implementation of the wire format, on any device.

Every number follows DESIGN.md's formula literally so that the other backends can be tested against it:
absmax per group in the input dtype, multiplier 128/absmax in fp32, codes rounded half-to-even and clamped
to [-128, 127], stored scale 1/multiplier, dequantization in fp32 rounded once to the requested dtype.
"""
import torch

from .. import qgz_wire
from ..wire import multiplier_from_absmax


def quantize(flat, groups):
    """Quantize a flat contiguous tensor whose numel is a multiple of ``groups``. Returns (int8 codes, fp32 scales)."""
    grouped = flat.view(groups, -1)
    absmax = grouped.abs().amax(dim=1).float() if flat.numel() else torch.zeros(groups, device=flat.device)
    multiplier, stored_scale, finite = multiplier_from_absmax(absmax)
    scaled = grouped.float() * multiplier.unsqueeze(1)
    scaled = torch.where(finite.unsqueeze(1), scaled, torch.zeros_like(scaled))
    codes = scaled.round_().clamp_(-128, 127).to(torch.int8)
    return codes.view(-1), stored_scale


def dequantize(codes, scales, group_size, dtype):
    """Dequantize ``codes`` (flat, numel <= len(scales) * group_size) with per-group ``scales`` into ``dtype``."""
    numel = codes.numel()
    if numel == scales.numel() * group_size:
        values = codes.view(scales.numel(), -1).float() * scales.unsqueeze(1)
    else:
        group_of = torch.arange(numel, device=codes.device) // group_size
        values = codes.float() * scales[group_of]
    return values.view(-1).to(dtype)


# qgZ's codec: the torch implementation lives with its layout in qgz_wire.
qgz_encode = qgz_wire.encode
qgz_reduce_encode = qgz_wire.reduce_encode
qgz_decode_sum = qgz_wire.decode_sum
