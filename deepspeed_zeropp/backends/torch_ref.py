"""Pure-torch quantizer: the reference implementation of the wire format, on any device.

Every number follows DESIGN.md's formula literally so that the other backends can be tested against it:
absmax per group in the input dtype, multiplier 128/absmax in fp32, codes rounded half-to-even and clamped
to [-128, 127], stored scale 1/multiplier, dequantization in fp32 rounded once to the requested dtype.
Group layouts: grouping.py.
"""
import torch

from .. import qgz_wire
from ..wire import multiplier_from_absmax


def quantize(x, groups, group_size=None):
    """Quantize a contiguous tensor, read flat, in ``groups`` groups of ``group_size`` elements (default: equal
    groups), the last one possibly short. Returns (int8 codes of x's shape, fp32 scales [groups])."""
    flat = x.reshape(-1)
    numel = flat.numel()
    group_size = numel // groups if group_size is None else group_size
    if numel < groups * group_size:  # a short last group: zeros never raise an absmax, and their codes are dropped
        flat = torch.cat([flat, flat.new_zeros(groups * group_size - numel)])
    grouped = flat.view(groups, group_size)
    absmax = grouped.abs().amax(dim=1).float() if group_size else torch.zeros(groups, device=flat.device)
    multiplier, stored_scale, finite = multiplier_from_absmax(absmax)
    scaled = grouped.float() * multiplier.unsqueeze(1)
    scaled = torch.where(finite.unsqueeze(1), scaled, torch.zeros_like(scaled))
    codes = scaled.round_().clamp_(-128, 127).to(torch.int8)
    return codes.view(-1)[:numel].view(x.shape), stored_scale


def dequantize(codes, scales, group_size, dtype, block_numel=None):
    """Dequantize contiguous ``codes`` (read flat; the result has their shape) with per-group ``scales`` into ``dtype``. Groups of ``group_size``: element i is in
    group i // group_size (codes may be a prefix of len(scales) * group_size); with ``block_numel`` n, the codes
    are blocks of n elements, each in ceil(n / group_size) groups with a short last one: group
    (i // n) * ceil(n / group_size) + (i % n) // group_size."""
    shape, codes, scales = codes.shape, codes.reshape(-1), scales.reshape(-1)
    numel = codes.numel()
    if block_numel is None and numel == scales.numel() * group_size:
        values = codes.view(scales.numel(), -1).float() * scales.unsqueeze(1)
    else:
        index = torch.arange(numel, device=codes.device)
        if block_numel is None:
            group_of = index // group_size
        else:
            group_of = (index // block_numel) * -(-block_numel // group_size) + (index % block_numel) // group_size
        values = codes.float() * scales[group_of]
    return values.view(shape).to(dtype)


# qgZ's codec: the torch implementation lives with its layout in qgz_wire.
qgz_encode = qgz_wire.encode
qgz_reduce_encode = qgz_wire.reduce_encode
qgz_decode_sum = qgz_wire.decode_sum
