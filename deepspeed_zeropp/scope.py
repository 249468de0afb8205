"""What a patched DeepSpeed site wants from the quantizer during its call, scoped to that call.

Releases before 0.19.6 call ``dequantize(q, scale)`` without a dtype, and the coalesced site never passes one.
Rather than rewrite those methods, the site wrappers record what the parameters need and publish it here for
the duration of the call; the patched ``CUDAQuantizer.dequantize`` reads it when its caller gave no dtype.
"""
import contextlib
import contextvars
from typing import NamedTuple, Optional, Tuple

import torch


class DequantTarget(NamedTuple):
    dtype: torch.dtype
    group_size: Optional[int] = None  # set when the codes are the prefix of a padded gathered buffer
    segments: Optional[Tuple[Tuple[int, int], ...]] = None  # (groups, group size) runs of a non-uniform buffer


_current = contextvars.ContextVar("deepspeed_zeropp_dequant_target", default=None)
_deferring = contextvars.ContextVar("deepspeed_zeropp_defer_quantize", default=False)
DEFERRED = "deepspeed_zeropp: quantization deferred until the partition holds its values"


@contextlib.contextmanager
def _set(var, value):
    token = var.set(value)
    try:
        yield
    finally:
        var.reset(token)


def dequant_target(dtype, group_size=None, segments=None):
    return _set(_current, DequantTarget(dtype, group_size, segments))


def current_target():
    """The innermost active target, or None outside any patched gather site."""
    return _current.get()


def deferring_quantize():
    """While active, ``CUDAQuantizer.quantize`` returns its (zeroed) input and the DEFERRED marker as scale:
    DeepSpeed's partitioning quantizes a fresh, empty buffer before copying values into it (MixZ++)."""
    return _set(_deferring, True)


def quantize_is_deferred():
    return _deferring.get()
