"""The dtype (and group size) a gather site wants back from the quantizer, scoped to that site's call.

Releases before 0.19.6 call ``dequantize(q, scale)`` without a dtype, and the coalesced site never passes one.
Rather than rewrite those methods, the site wrappers record what the parameters need and publish it here for
the duration of the call; the patched ``CUDAQuantizer.dequantize`` reads it when its caller gave no dtype.
"""
import contextlib
import contextvars
from typing import NamedTuple, Optional

import torch


class DequantTarget(NamedTuple):
    dtype: torch.dtype
    group_size: Optional[int] = None  # set when the codes are the prefix of a padded gathered buffer


_current = contextvars.ContextVar("deepspeed_zeropp_dequant_target", default=None)


@contextlib.contextmanager
def dequant_target(dtype, group_size=None):
    token = _current.set(DequantTarget(dtype, group_size))
    try:
        yield
    finally:
        _current.reset(token)


def current_target():
    """The innermost active target, or None outside any patched gather site."""
    return _current.get()
