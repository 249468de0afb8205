"""The interface every backend module implements (``torch_ref``, ``cuda``, ``deepspeed_op``).

A backend is a module; :class:`Backend` spells out what the registry (``backends/__init__.py``), ``ops`` and
``qgz`` call on it, so that a module can be checked against it (:func:`missing`). Arguments arrive already
validated by the callers: contiguous tensors (read flat) whose sizes agree with the layout.
"""
from typing import Optional, Protocol, runtime_checkable

import torch

from ..formats.grouping import GatheredLayout
from ..formats.int4 import Feedback


@runtime_checkable
class Backend(Protocol):
    """What a backend module provides.

    ``NAME``: its name in ``BACKENDS``. ``SERVES_QGZ``: whether its ``qgz_*`` functions implement qgZ's 4-bit
    wire (``formats/int4.py``) for every supported dtype; a backend that does not still defines them, raising, and
    the registry's :func:`~deepspeed_zeropp.backends.qgz_backend` names the backend that serves qgZ instead.

    ``layout``, in ``dequantize`` and the entry points below: a ``formats.grouping.GatheredLayout``, the group layout
    of the codes as their caller knew it (ops' checks, a gather seam, a packet), passed on unchanged; a backend reads
    it through its members (``uniform``, ``group_size``, ``group_of``, ``kernel_arguments``, ...) only.

    Optional: ``bind_quantize(groups, group_size)`` and ``bind_dequantize(layout, dtype)`` return
    ``(function, arguments)`` with ``function(tensors..., *arguments)`` doing what ``quantize`` / ``dequantize`` do
    with those arguments; ``ops`` remembers the pair per call signature, so a compiled entry point is called with no
    Python frame of the backend (``cuda`` offers them). Without them ``ops`` calls ``quantize`` / ``dequantize``.

    Optional, for packets (``formats/int8.py``: a rank's codes and scales in one byte buffer, one all-gather):
    ``quantize_into(x, groups, group_size, codes, scales)`` writes ``quantize``'s results into the packet's views,
    and ``dequantize_ranks(codes, scales, layout, dtype)`` dequantizes per-rank blocks read in place from a
    gathered buffer (``codes`` [k, n] and ``scales`` [k, G], strided views; ``layout``: the packets' ``gathered``,
    one block per row) into a new [k, n] tensor. Without them ``ops`` copies into and out of the packets around
    ``quantize`` / ``dequantize`` (same values, more copies; ``torch_ref`` and ``cuda`` offer both).
    ``quantize_many_into(xs, groups, group_sizes, codes, scales)`` is ``quantize_into`` for several inputs of one
    device and dtype (lists), at most the module's ``MAX_SEGMENTS`` where it sets one (``cuda``: one kernel a call);
    ``ops.quantize_packed_many`` calls it, else ``quantize_packed`` per input.
    ``dequantize_parts_into(codes, scales, layout, first_columns, outs)`` writes columns ``first_columns[i]`` on of
    such rows (``codes`` and ``scales`` the rows' whole [k, n] and [k, G]) into ``outs[i]``, a contiguous [k, m_i]:
    each parameter's part of every rank, straight into its buffer; ``ops.dequantize_packed_parts`` calls it where
    the module's ``WRITES_PARTS`` is true."""

    NAME: str
    SERVES_QGZ: bool

    def quantize(self, x: torch.Tensor, groups: int, group_size: Optional[int] = None):
        """int8 weight wire (``formats/int8.py``): ``x`` read flat in ``groups`` groups of ``group_size`` elements
        (default: equal groups), the last one possibly short -> (int8 codes of x's shape, fp32 scales [groups])."""

    def dequantize(self, codes: torch.Tensor, scales: torch.Tensor, layout: GatheredLayout,
                   dtype: torch.dtype) -> torch.Tensor:
        """Inverse of ``quantize``, a new tensor of ``dtype`` and the codes' shape, element i times the scale of
        ``layout.group_of(i)`` (which ``layout.fits`` the codes and scales)."""

    def qgz_encode(self,
                   flat: torch.Tensor,
                   destinations: int,
                   rows: int,
                   chunk: int,
                   padded_chunk: int,
                   feedback: Optional[Feedback] = None) -> torch.Tensor:
        """qgZ step 1: a flat gradient -> uint8 blocks [destinations, int4.block_bytes(rows, padded_chunk)]."""

    def qgz_reduce_encode(self,
                          blocks: torch.Tensor,
                          rows: int,
                          padded_chunk: int,
                          feedback: Optional[Feedback] = None) -> torch.Tensor:
        """qgZ step 2: blocks [sources, bytes] -> fp32 sum over sources -> one one-row block per row."""

    def qgz_decode_sum(self, blocks: torch.Tensor, padded_chunk: int, count: int, factor: float,
                       dtype: torch.dtype) -> torch.Tensor:
        """qgZ step 3: one-row blocks -> the first ``count`` values of (fp32 sum over sources) * factor."""


MEMBERS = ("NAME", "SERVES_QGZ", "quantize", "dequantize", "qgz_encode", "qgz_reduce_encode", "qgz_decode_sum")


def missing(module):
    """The members of :class:`Backend` that ``module`` lacks (empty when it implements the interface)."""
    return [name for name in MEMBERS if not hasattr(module, name)]
