"""An independent reference of the wire format (numpy float32 arithmetic, one group at a time).

Written from the formula in docs/numerics.md, not from the package's code, so that exact equality with it means the
backends implement the formula and not merely agree with each other. Layouts are given explicitly: ``groups``
groups of ``group_size`` elements (default: equal groups), the last one ending at the buffer's end.
"""
import numpy as np
import torch

F32 = np.float32


def quantize(x, groups, group_size=None):
    values = x.detach().float().reshape(-1).numpy()  # exact: every fp16/bf16 value is an fp32 value
    size = values.size // groups if group_size is None else group_size
    codes = np.zeros(values.size, dtype=np.int8)
    scales = np.zeros(groups, dtype=np.float32)
    for g in range(groups):
        chunk = values[g * size:(g + 1) * size]
        m = F32(np.max(np.abs(chunk))) if chunk.size else F32(0)
        if not np.isfinite(m):
            scales[g] = np.nan
            continue
        with np.errstate(over="ignore", divide="ignore"):
            mult = F32(1) if m == 0 else min(F32(128) / m, np.finfo(np.float32).max)
        codes[g * size:g * size + chunk.size] = np.clip(np.rint(chunk * mult), -128, 127)  # float32 product
        scales[g] = F32(1) / mult
    return torch.from_numpy(codes).view(x.shape), torch.from_numpy(scales)


def dequantize(codes, scales, dtype, group_size=None, block_numel=None):
    """Element i uses scale (i // n) * ceil(n / E) + (i % n) // E for blocks of n = ``block_numel`` elements (each
    quantized on its own), else i // E; E defaults to equal groups."""
    flat = codes.reshape(-1).numpy().astype(np.float32)
    size = flat.size // scales.numel() if group_size is None else group_size
    if block_numel is None:
        per_element = np.repeat(scales.numpy(), size)[:flat.size]
    else:
        index = np.arange(flat.size)
        per_element = scales.numpy()[(index // block_numel) * -(-block_numel // size) + (index % block_numel) // size]
    out = flat * per_element
    return torch.from_numpy(out.astype(np.float32)).to(dtype).view(codes.shape)
