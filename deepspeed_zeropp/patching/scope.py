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
    """The dtype to hand back and the group layout of the gathered codes (formats/grouping.py): k per-rank blocks, each
    quantized on its own, given by one of ``block_numel`` (the block's numel, for codes narrowed to a prefix),
    ``blocks`` (k, when the site dequantizes several buffers of different block sizes) or ``segments`` (the numel
    of every separately quantized buffer, in order). None of them: the codes are one quantized buffer.

    ``packed``: the codes and scales were all-gathered as packets (``formats/int8.py``): ``(received, layout)``,
    the gathered bytes and the packets' ``int8.Packet``. The arguments upstream passes to dequantize then only give
    the shape of the result; the values are read from ``received``."""
    dtype: torch.dtype
    block_numel: Optional[int] = None
    blocks: Optional[int] = None
    segments: Optional[Tuple[int, ...]] = None
    packed: Optional[tuple] = None

    def block_numel_of(self, codes):
        """The per-rank block numel of ``codes``, or None when they are one quantized buffer (or empty blocks)."""
        if self.blocks is None:
            return self.block_numel or None
        if codes.numel() % self.blocks != 0:
            raise ValueError(f"{codes.numel()} gathered codes cannot be {self.blocks} equal per-rank blocks")
        return codes.numel() // self.blocks or None


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


def dequant_target(dtype, block_numel=None, blocks=None, segments=None, packed=None):
    return _set(_current, DequantTarget(dtype, block_numel, blocks, segments, packed))


def current_target():
    """The innermost active target, or None outside any patched gather site."""
    return _current.get()


def deferring_quantize():
    """While active, ``CUDAQuantizer.quantize`` returns its (zeroed) input and the DEFERRED marker as scale:
    DeepSpeed's partitioning quantizes a fresh, empty buffer before copying values into it (MixZ++)."""
    return _set(_deferring, True)


def quantize_is_deferred():
    return _deferring.get()
