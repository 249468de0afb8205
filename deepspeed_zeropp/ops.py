"""Public quantize / dequantize: input checks, shape handling and backend dispatch, in one place.

Backends only ever see flat, contiguous tensors whose sizes already agree with the group count; everything a
caller can get wrong is rejected here with an error that names the problem and what is accepted.
"""
import torch

from .dtypes import DEFAULT_DEQUANT_DTYPE, check_float_dtype, check_wire_tensors
from .grouping import group_count
from .backends import resolve_backend


def quantize(x, groups=None, backend="auto"):
    """Quantize ``x`` (fp16, bf16 or fp32, any shape and layout) to int8 codes of x's shape and 1-D fp32 scales.

    ``groups`` defaults to :func:`group_count` of ``x.numel()`` and must divide ``x.numel()``.
    """
    _check_tensor(x, "quantize input")
    check_float_dtype(x.dtype, "quantize input")
    numel = x.numel()
    if groups is None:
        groups = group_count(numel)
    if not isinstance(groups, int) or isinstance(groups, bool) or groups < 1 or numel % groups != 0:
        raise ValueError(f"groups must be a positive int dividing numel={numel}, got {groups!r}")
    impl = resolve_backend(backend, x.device)
    codes, scales = impl.quantize(x.detach().contiguous().view(-1), groups)
    return codes.view(x.shape), scales


def _check_tensor(value, what):
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{what} must be a torch.Tensor, got {type(value).__name__}")
    if value.device.type == "meta":
        raise ValueError(f"{what} is on the meta device, which holds no values; pass a tensor on a real device")


def _checked_output_dtype(codes, scales, dtype):
    _check_tensor(codes, "dequantize codes")
    _check_tensor(scales, "dequantize scales")
    if scales.device != codes.device:
        raise ValueError(f"dequantize scales are on {scales.device} but the codes on {codes.device}; "
                         "pass both on the same device")
    check_wire_tensors(codes, scales)
    dtype = DEFAULT_DEQUANT_DTYPE if dtype is None else dtype
    check_float_dtype(dtype, "dequantize output")
    return dtype


def dequantize(codes, scales, dtype=None, group_size=None, backend="auto"):
    """Dequantize int8 ``codes`` with fp32 ``scales`` ([G] or [G, 1]) to ``dtype`` (fp16 when None), codes' shape.

    Groups are contiguous runs of ``group_size`` elements (default ``codes.numel() // G``, which must then divide
    exactly). A larger ``group_size`` describes codes that are the prefix of a padded, gathered buffer.
    """
    dtype = _checked_output_dtype(codes, scales, dtype)
    flat_scales = scales.reshape(-1).contiguous()
    num_groups, numel = flat_scales.numel(), codes.numel()
    if group_size is None:
        if numel % num_groups != 0:
            raise ValueError(f"{numel} codes cannot be split into {num_groups} equal groups; pass group_size")
        group_size = numel // num_groups
    elif numel > num_groups * group_size or group_size < 1:
        raise ValueError(f"{numel} codes do not fit {num_groups} groups of {group_size}")
    impl = resolve_backend(backend, codes.device)
    out = impl.dequantize(codes.contiguous().view(-1), flat_scales, group_size, dtype)
    return out.view(codes.shape)


def dequantize_segments(codes, scales, segments, dtype=None, backend="auto"):
    """Dequantize a buffer made of runs with different group sizes: ``segments`` lists (groups, group_size)
    in buffer order. DeepSpeed's coalesced MixZ++ gather concatenates partitions quantized one by one."""
    dtype = _checked_output_dtype(codes, scales, dtype)
    flat_codes, flat_scales = codes.contiguous().view(-1), scales.reshape(-1)
    if not all(_positive_int_pair(segment) for segment in segments):
        raise ValueError(f"segments must be (groups, group_size) pairs of positive ints, got {segments!r}")
    if sum(g * e for g, e in segments) != flat_codes.numel() or sum(g for g, _ in segments) != flat_scales.numel():
        raise ValueError(
            f"segments {segments} do not cover {flat_codes.numel()} codes and {flat_scales.numel()} scales")
    impl = resolve_backend(backend, codes.device)
    out = torch.empty(flat_codes.numel(), dtype=dtype, device=codes.device)
    code_at = scale_at = 0
    for groups, group_size in _merge_runs(segments):
        numel = groups * group_size
        out[code_at:code_at + numel] = impl.dequantize(flat_codes[code_at:code_at + numel],
                                                       flat_scales[scale_at:scale_at + groups].contiguous(),
                                                       group_size, dtype)
        code_at, scale_at = code_at + numel, scale_at + groups
    return out.view(codes.shape)


def _positive_int_pair(segment):
    return (isinstance(segment, (tuple, list)) and len(segment) == 2
            and all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in segment))


def _merge_runs(segments):
    """Join neighbouring runs of the same group size (one backend call each instead of one per partition)."""
    merged = []
    for groups, group_size in segments:
        if merged and merged[-1][1] == group_size:
            merged[-1] = (merged[-1][0] + groups, group_size)
        else:
            merged.append((groups, group_size))
    return merged
