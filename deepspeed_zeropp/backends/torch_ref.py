"""Pure-torch quantizer: the reference implementation of the wire format, on any device.

Every number follows the wire formats (docs/numerics.md, ``formats/``) literally so that the other backends can be
tested against it. int8 weights: absmax per group in the input dtype, multiplier 128/absmax in fp32, codes rounded
half-to-even and clamped to [-128, 127], stored scale 1/multiplier, dequantization in fp32 rounded once to the
requested dtype; group layouts: formats/grouping.py. qgZ: the three steps of ``formats/int4.py`` on its per-group codec.
"""
import torch

from ..formats import int4
from ..formats.int8 import CODE_MAX, CODE_MIN, multiplier_from_absmax

NAME = "torch"
SERVES_QGZ = True


def _scaled(x, groups, group_size, scales=None):
    """(rounded, clamped fp32 codes [groups, group_size] with the short last group's tail zero, stored scales,
    written into ``scales`` when given)."""
    flat = x.reshape(-1)
    numel = flat.numel()
    if numel < groups * group_size:  # a short last group: zeros never raise an absmax, and their codes are dropped
        flat = torch.cat([flat, flat.new_zeros(groups * group_size - numel)])
    grouped = flat.view(groups, group_size)
    absmax = grouped.abs().amax(dim=1).float() if group_size else torch.zeros(groups, device=flat.device)
    multiplier, stored_scale, finite = multiplier_from_absmax(absmax, scales)
    scaled = grouped.float() * multiplier.unsqueeze(1)
    scaled = torch.where(finite.unsqueeze(1), scaled, torch.zeros_like(scaled))
    return scaled.round_().clamp_(CODE_MIN, CODE_MAX), stored_scale


def quantize(x, groups, group_size=None):
    """Quantize a contiguous tensor, read flat, in ``groups`` groups of ``group_size`` elements (default: equal
    groups), the last one possibly short. Returns (int8 codes of x's shape, fp32 scales [groups])."""
    numel = x.numel()
    scaled, stored_scale = _scaled(x, groups, numel // groups if group_size is None else group_size)
    return scaled.to(torch.int8).view(-1)[:numel].view(x.shape), stored_scale


def quantize_into(x, groups, group_size, codes, scales):
    """``quantize`` writing into ``codes`` (int8, x's numel, contiguous) and ``scales`` (fp32 [groups]): the
    conversions are the writes, so this costs no more operations than ``quantize``."""
    scaled, _ = _scaled(x, groups, group_size, scales)
    codes.view(-1).copy_(scaled.view(-1)[:x.numel()])


def quantize_many_into(xs, groups, group_sizes, codes, scales):
    """``quantize_into`` for each of ``xs`` (the CUDA backend's batch, here one input after another)."""
    for x, count, size, out, out_scales in zip(xs, groups, group_sizes, codes, scales):
        quantize_into(x, count, size, out, out_scales)


def dequantize(codes, scales, layout, dtype):
    """Dequantize contiguous ``codes`` (read flat; the result has their shape) with per-group ``scales`` into
    ``dtype``, in ``layout`` (a ``grouping.GatheredLayout``): element i times the scale of group
    ``layout.group_of(i)``; equal groups covering the codes exactly take one broadcast product."""
    shape, codes, scales = codes.shape, codes.reshape(-1), scales.reshape(-1)
    numel = codes.numel()
    if layout.uniform and numel == scales.numel() * layout.group_size:
        values = codes.view(scales.numel(), -1).float() * scales.unsqueeze(1)
    else:
        values = codes.float() * scales[layout.group_of(torch.arange(numel, device=codes.device))]
    return values.view(shape).to(dtype)


def dequantize_ranks(codes, scales, layout, dtype):
    """Dequantize ``k`` per-rank blocks read in place: ``codes`` [k, n] and ``scales`` [k, G] may be strided views
    of a gathered buffer of packets (rows need not be contiguous with each other); each row is one block of
    ``layout`` (the packets' ``gathered``). Returns a new contiguous tensor [k, n] of ``dtype``; element for element
    the same arithmetic as ``dequantize``."""
    ranks, numel = codes.shape
    groups = scales.shape[1]
    if layout.uniform:
        values = codes.view(ranks, groups, layout.group_size).float() * scales.unsqueeze(2)
    else:
        values = codes.float() * scales[:, layout.group_of(torch.arange(numel, device=codes.device))]
    return values.view(ranks, numel).to(dtype)


# Whether ops.dequantize_packed_parts calls dequantize_parts_into. Not here: on the CPU one dequantize of the bucket
# and one copy per part take fewer host calls than a group index per part; the function is the reference that the
# native backend's is tested against.
WRITES_PARTS = False


def dequantize_parts_into(codes, scales, layout, first_columns, outs):
    """Parts of per-rank rows, read in place, each into its own buffer: ``codes`` [k, n] and ``scales`` [k, G] the
    rows' whole codes and scales, each row one block of ``layout`` (the packets' ``gathered``); part i is columns
    ``first_columns[i]`` on, written into ``outs[i]`` (a contiguous [k, m_i] tensor of the output dtype). The same
    arithmetic as ``dequantize_ranks`` on the whole rows."""
    for first, out in zip(first_columns, outs):
        columns = torch.arange(first, first + out.shape[1], device=codes.device)
        out.copy_(codes.narrow(1, first, out.shape[1]).float() * scales[:, layout.group_of(columns)])


def _quantize_int4(values, feedback):
    return int4.quantize_int4(values) if feedback is None else int4.quantize_with_feedback(values, feedback)


def _to_blocks(packed, scales, blocks):
    """Codes and scales as ``blocks`` blocks: each block's packed codes, then its fp32 scales as raw bytes."""
    codes_bytes = packed.numel() // blocks
    out = torch.empty(blocks,
                      codes_bytes + scales.numel() * int4.SCALE_BYTES // blocks,
                      dtype=torch.uint8,
                      device=packed.device)
    out[:, :codes_bytes] = packed.view(blocks, -1)
    out[:, codes_bytes:] = scales.reshape(blocks, -1).view(torch.uint8)
    return out


def _sum_of_sources(blocks, rows, padded_chunk):
    """fp32 values of every source's rows, summed over sources in order: [rows * padded_chunk]."""
    codes_bytes = int4.codes_bytes(rows, padded_chunk)
    packed = blocks[:, :codes_bytes]
    scales = blocks[:, codes_bytes:].reshape(-1).view(torch.float32)  # flat: an empty block views as well
    values = int4.dequantize_int4(packed.reshape(-1), scales.reshape(-1)).view(blocks.shape[0], -1)
    total = values[0].clone()
    for source in values[1:]:
        total += source
    return total


def qgz_encode(flat, destinations, rows, chunk, padded_chunk, feedback=None):
    """A flat gradient -> uint8 blocks [destinations, int4.block_bytes(rows, padded_chunk)]; ``feedback``: an
    ``int4.Feedback`` of ``destinations * rows * padded_chunk`` values, or None."""
    chunks_total = destinations * rows
    values = torch.zeros(chunks_total * chunk, dtype=torch.float32, device=flat.device)
    values[:flat.numel()] = flat  # exact: every fp16/bf16 value is an fp32 value
    chunks = torch.zeros(chunks_total, padded_chunk, dtype=torch.float32, device=flat.device)
    chunks[:, :chunk] = values.view(chunks_total, chunk)
    swizzled = chunks.view(rows, destinations, padded_chunk).transpose(0, 1)  # [d, m] = chunk m * destinations + d
    return _to_blocks(*_quantize_int4(swizzled.reshape(-1), feedback), destinations)


def qgz_reduce_encode(blocks, rows, padded_chunk, feedback=None):
    """Received blocks [sources, int4.block_bytes(rows, padded_chunk)] -> [rows, int4.block_bytes(1, padded_chunk)];
    ``feedback``: an ``int4.Feedback`` of ``rows * padded_chunk`` values, or None."""
    return _to_blocks(*_quantize_int4(_sum_of_sources(blocks, rows, padded_chunk), feedback), rows)


def qgz_decode_sum(blocks, padded_chunk, count, factor, dtype):
    """Received one-row blocks [sources, int4.block_bytes(1, padded_chunk)] -> ``count`` values in ``dtype``.
    ``factor`` must be an fp32 value (the kernels take it as float)."""
    return (_sum_of_sources(blocks, 1, padded_chunk)[:count] * factor).to(dtype)
