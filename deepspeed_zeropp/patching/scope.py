"""What a patched DeepSpeed site wants from the quantizer during its call, scoped to that call.

Releases before 0.19.6 call ``dequantize(q, scale)`` without a dtype, and the coalesced site never passes one.
Rather than rewrite those methods, the site wrappers record what the parameters need and publish it here for
the duration of the call; the patched ``CUDAQuantizer.dequantize`` reads it when its caller gave no dtype.
"""
import contextlib
import contextvars
from typing import NamedTuple, Optional, Tuple

import torch

from ..formats.grouping import GatheredLayout, blocks_of


class DequantTarget(NamedTuple):
    """The dtype to hand back and the group layout of the gathered codes: k per-rank blocks, each quantized on its
    own. Where the seam knows the per-rank numel (codes narrowed to a prefix), ``layout`` is their
    ``grouping.GatheredLayout``, computed there once and passed to the backend unchanged. Two forms stay apart
    because no single layout is known when the seam publishes them: ``blocks`` (k: the site dequantizes several
    buffers of different block sizes under one target, so the layout is ``blocks_of(codes.numel() // k)`` of each
    call's codes, :meth:`layout_of`) and ``segments`` (the numel of every separately quantized buffer, in order:
    buffers of different sizes, one layout per run, ``ops.dequantize_segments``). None of them: the codes are one
    quantized buffer. (Fetches that sent packets are completed by ``seams/fetch.py`` without a target.)"""
    dtype: torch.dtype
    layout: Optional[GatheredLayout] = None
    blocks: Optional[int] = None
    segments: Optional[Tuple[int, ...]] = None

    def layout_of(self, codes):
        """The ``GatheredLayout`` of ``codes``: ``layout``, or that of ``blocks`` equal per-rank blocks of them; None
        when they are one quantized buffer (or empty blocks)."""
        if self.blocks is None:
            return self.layout
        if codes.numel() % self.blocks != 0:
            raise ValueError(f"{codes.numel()} gathered codes cannot be {self.blocks} equal per-rank blocks")
        block_numel = codes.numel() // self.blocks
        return blocks_of(block_numel) if block_numel else None


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


def dequant_target(dtype, layout=None, blocks=None, segments=None):
    return _set(_current, DequantTarget(dtype, layout, blocks, segments))


def current_target():
    """The innermost active target, or None outside any patched gather site."""
    return _current.get()


def deferring_quantize():
    """While active, ``CUDAQuantizer.quantize`` returns its (zeroed) input and the DEFERRED marker as scale:
    DeepSpeed's partitioning quantizes a fresh, empty buffer before copying values into it (MixZ++)."""
    return _set(_deferring, True)


def quantize_is_deferred():
    return _deferring.get()
