"""An independent, element-by-element reference of the wire format (numpy float32 arithmetic).

Written from DESIGN.md's formula, not from the package's code, so that exact equality with it means the
backends implement the formula and not merely agree with each other.
"""
import numpy as np
import torch

F32 = np.float32


def quantize(x, groups):
    values = x.detach().float().reshape(-1).numpy()  # exact: every fp16/bf16 value is an fp32 value
    size = values.size // groups
    codes = np.zeros(values.size, dtype=np.int8)
    scales = np.zeros(groups, dtype=np.float32)
    for g in range(groups):
        chunk = values[g * size:(g + 1) * size]
        m = F32(np.max(np.abs(chunk))) if size else F32(0)
        if not np.isfinite(m):
            scales[g] = np.nan
            continue
        with np.errstate(over="ignore", divide="ignore"):
            mult = F32(1) if m == 0 else min(F32(128) / m, np.finfo(np.float32).max)
        for i, v in enumerate(chunk):
            codes[g * size + i] = int(np.clip(np.rint(F32(v) * mult), -128, 127))
        scales[g] = F32(1) / mult
    return torch.from_numpy(codes).view(x.shape), torch.from_numpy(scales)


def dequantize(codes, scales, dtype):
    flat = codes.reshape(-1).numpy().astype(np.float32)
    size = flat.size // scales.numel()
    out = flat * np.repeat(scales.numpy(), size)
    return torch.from_numpy(out.astype(np.float32)).to(dtype).view(codes.shape)
