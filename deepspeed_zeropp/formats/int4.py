"""qgZ's 4-bit gradient wire: the codec of one group, the block layout and the error-feedback rule
(docs/numerics.md). The three steps built on it are implemented in ``backends/torch_ref.py`` (the reference, any
device) and ``csrc/qgz.cu`` (CUDA), bit for bit alike; ``csrc/wire_formats.h`` holds these constants for the kernels.

Codec: groups of GROUP values; scale = max(absmax, MIN_SCALE) in fp32, multiplier = LEVELS / scale (correctly
rounded), codes = round-half-even(value * multiplier) clamped to [-LEVELS, LEVELS] = [-7, 7], two per byte as 4-bit
two's complement (even index in the low nibble; -8 is never produced). A code decodes to (code * STEP) * scale in fp32,
STEP = 1 / LEVELS rounded to fp32. The codes are symmetric, so +absmax and -absmax are both levels: rounding errs by at
most half a step (scale / 14) either way, with no clamp bias; and 7 * STEP rounds to exactly 1, so +-absmax decode to
+-absmax exactly (a group of equal magnitudes, e.g. a constant gradient, passes every stage unchanged). MIN_SCALE =
2^-125 keeps the multiplier finite: groups with absmax below it (under 2.4e-38) are rounded on its step instead. A
group holding inf or NaN sends codes 0 and scale NaN: it, and only it, arrives as NaN.

Block: what one rank sends one peer in an all-to-all, as raw bytes so that codes and scales travel in one call.
A block of ``rows`` rows of ``padded_chunk`` values (a multiple of GROUP) is the rows' packed codes
(``rows * padded_chunk / 2`` bytes), then their fp32 scales (``rows * padded_chunk / GROUP`` of them).

The three steps of qgZ, each with the same products and sums in the same order in both implementations:
- ``qgz_encode``: a gradient (any float dtype) cut into chunks of ``chunk`` values, each zero-padded to
  ``padded_chunk``; destination d gets a block whose row m is chunk ``m * destinations + d``.
- ``qgz_reduce_encode``: blocks from several sources -> per-row fp32 sum, summed over sources in order -> one
  one-row block per row.
- ``qgz_decode_sum``: one-row blocks from several sources -> fp32 sum over sources in order -> times ``factor``
  -> the gradient's dtype, rounded once.

Error feedback (LoCo): ``qgz_encode`` and ``qgz_reduce_encode`` optionally take a :class:`Feedback`, an fp32 error
buffer holding one value per encoded value (in the blocks' order: destination, row, padded column). The stage then
quantizes ``v = x + e`` (its fp32 input plus the carried error) instead of ``x``, and updates the buffer in place to
``e' = (beta * e) + ((1 - beta) * (v - decode(v)))``, each product and the sum rounded to fp32 (``beta`` and
``1 - beta`` as fp32 values). A group that quantizes as non-finite (scale NaN) sets its errors to 0, so an overflow
is not carried into later calls.
"""
from typing import NamedTuple

import torch

BITS = 4
LEVELS = (1 << (BITS - 1)) - 1  # codes in [-7, 7]: symmetric, unbiased
GROUP = 256  # values per 4-bit group (even: two codes per byte)
MIN_SCALE = 2.0**-125  # LEVELS / MIN_SCALE is below FLT_MAX (2^-126 would overflow it)
# 1 / LEVELS correctly rounded to fp32, as the kernels' compile-time 1.f / 7.f (tensor / tensor: not via double).
STEP = float(torch.tensor(1.0) / torch.tensor(float(LEVELS)))

SCALE_BYTES = 4  # one fp32 scale per group


def codes_bytes(rows, padded_chunk):
    """Bytes of a block's packed codes (two per byte), where its scales begin."""
    return rows * padded_chunk // 2


def block_bytes(rows, padded_chunk):
    """Bytes of one block: packed codes, then one fp32 scale per group."""
    return codes_bytes(rows, padded_chunk) + rows * (padded_chunk // GROUP) * SCALE_BYTES


def quantize_int4(values):
    """fp32 values (numel a multiple of GROUP) -> (uint8, two codes per byte; fp32 scales, one per group)."""
    grouped = values.reshape(-1, GROUP)
    absmax = grouped.abs().amax(dim=1)
    finite = torch.isfinite(absmax)
    scale = absmax.clamp(min=MIN_SCALE)
    # Tensor / tensor: the correctly rounded quotient, as the kernels compute it (``7.0 / t`` is not).
    multiplier = torch.full_like(scale, float(LEVELS)) / scale
    codes = (grouped * multiplier.unsqueeze(1)).round_().clamp_(-LEVELS, LEVELS)
    codes = torch.where(finite.unsqueeze(1), codes, torch.zeros_like(codes)).to(torch.int16) & 0xF
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8)
    return packed.reshape(-1), torch.where(finite, scale, torch.full_like(scale, float("nan")))


def dequantize_int4(packed, scales):
    """Inverse of :func:`quantize_int4`, in fp32."""
    nibbles = torch.stack([packed & 0xF, packed >> 4], dim=-1).to(torch.int16)
    codes = torch.where(nibbles >= 1 << (BITS - 1), nibbles - (1 << BITS), nibbles).reshape(-1, GROUP)
    return ((codes.float() * STEP) * scales.unsqueeze(1)).reshape(-1)


class Feedback(NamedTuple):
    """One stage's error feedback: ``error`` (fp32, updated in place) and the fp32 weights of :func:`weights`."""
    error: torch.Tensor
    beta: float
    keep: float  # 1 - beta


def weights(err_beta):
    """(beta, 1 - beta) as fp32 values, the latter computed in fp32: what the kernels receive as floats."""
    beta = torch.tensor(err_beta, dtype=torch.float32)
    return float(beta), float(torch.tensor(1.0, dtype=torch.float32) - beta)


def quantize_with_feedback(values, feedback):
    """:func:`quantize_int4` of ``values + error``, updating ``feedback.error`` in place as the module
    docstring says. Returns (packed codes, scales)."""
    error = feedback.error
    if error.dtype != torch.float32 or error.shape != values.shape:
        raise ValueError(f"error feedback: the buffer must be float32 with {values.numel()} values (one per encoded "
                         f"value), got {error.dtype} with {error.numel()}")
    compensated = values + error
    packed, scales = quantize_int4(compensated)
    residual = compensated - dequantize_int4(packed, scales)
    # Separate products and a plain sum (no alpha=, no addcmul): each op rounds once, as __fmul_rn/__fadd_rn.
    updated = (error * feedback.beta + residual * feedback.keep).view(-1, GROUP)
    error.view(-1, GROUP).copy_(torch.where(torch.isnan(scales).unsqueeze(1), torch.zeros_like(updated), updated))
    return packed, scales
