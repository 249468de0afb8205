"""Quantized gradient reduce-scatter (ZeRO++ qgZ) that is correct for fp16, bf16 and fp32 gradients.

DeepSpeed's ``all_to_all_quant_reduce`` hands every gradient to kernels that read it as fp16 bits, sums the node-local
partials in fp16 and casts the fp16 result back. This keeps its communication pattern (4-bit codes, an all-to-all
inside each node, then one across nodes) but reads each gradient in its own dtype, accumulates every sum in fp32,
and rounds once to the gradient's dtype. The wire is ``formats/int4.py``; its steps come from the backend that serves
qgZ for the patch's backend (``backends.qgz_backend``: pure torch on any device and over gloo, ``csrc/qgz.cu`` for
CUDA tensors, bit for bit the same).

Layout: rank r = node * L + local owns chunk r of the flattened gradient (as ``reduce_scatter_coalesced``), and the
result is the mean over all ranks, as there. Chunks are padded to whole 4-bit groups with zeros. With one rank per
node (L = 1) there is no node-local sum to take, so the node-local all-to-all and its 4-bit rounding are skipped.
Upstream sends each gradient in its own all-to-alls; here the 4-bit gradients of one call share them, in batches
(``BATCH_BYTES``): each stage's blocks are concatenated per peer, exchanged once and split again. The values are the
same either way.

Which tensors go in 4 bits: as upstream, only tensors of 2 or more dimensions whose numel is a multiple of
2 x world. The others (1-D biases and norms, 0-d, empty and odd-sized tensors: mostly few values, where 4-bit
rounding would cost accuracy and save little traffic) are reduced unquantized, all of a call's in one fp32
reduce-scatter (each zero-padded to ``world`` chunks), then times the same fp32 mean factor and rounded once to the
tensor's dtype. Both paths return this rank's chunk: ``ceil(numel / world)`` values, fewer (possibly none) on the
last ranks, as ``reduce_scatter_coalesced``.
"""
import math
import struct
from typing import NamedTuple

import torch

from . import backends
from .formats.int4 import GROUP, block_bytes

# qgZ's all-to-alls carry several gradients' blocks at once, up to this many bytes sent per rank (a gradient larger
# than that goes alone): one collective per batch rather than one per gradient and stage (each a launch and a round
# trip), with the node-local stage's send and receive buffers bounded. The inter-node stage's (1 / ranks per node of
# those) stay allocated until every batch of the call has been sent.
BATCH_BYTES = 64 << 20


def codec(device):
    """The backend module serving qgZ on ``device`` for the default backend (its qgZ rule: backends/__init__.py)."""
    return backends.qgz_backend(backends.default(), device)


def _all_to_all(blocks, group, async_op=False):
    """``blocks``' rows exchanged with the group's peers: the received rows, and with ``async_op`` the work to wait
    for before reading them."""
    from deepspeed import comm as dist
    received = torch.empty_like(blocks)
    work = dist.all_to_all_single(received, blocks, group=group, async_op=async_op)
    return (received, work) if async_op else received


def quantizes(tensor, world):
    """Whether qgZ sends ``tensor`` in 4 bits on a ``world``-rank reduce-scatter (else it goes unquantized)."""
    return tensor.dim() >= 2 and tensor.numel() > 0 and tensor.numel() % (2 * world) == 0


def _partition(numel, world, rank):
    """(values per rank, this rank's count): rank r owns values [r * chunk, (r + 1) * chunk) of the flat tensor."""
    chunk = math.ceil(numel / world)
    return chunk, min(max(numel - rank * chunk, 0), chunk)


def reduce_scatter_plain(tensors, world, rank, factor):
    """This rank's mean-reduced chunk of each tensor, unquantized: one fp32 reduce-scatter of a [world, sum of
    chunks] buffer whose row r holds every tensor's chunk r."""
    from deepspeed import comm as dist
    chunks = [_partition(t.numel(), world, rank)[0] for t in tensors]
    if sum(chunks) == 0:  # no tensors, or only empty ones: nothing to send
        return [torch.empty(0, dtype=t.dtype, device=t.device) for t in tensors]
    device = tensors[0].device
    # Zero-filled only where some tensor does not fill its rows (one copy per tensor otherwise).
    exact = all(t.numel() == world * chunk for t, chunk in zip(tensors, chunks))
    rows = (torch.empty if exact else torch.zeros)(world, sum(chunks), dtype=torch.float32, device=device)
    start = 0
    for tensor, chunk in zip(tensors, chunks):
        # Row r takes values [r * chunk, (r + 1) * chunk) straight from the tensor; what lies past its end stays zero.
        flat = tensor.reshape(-1)
        full, rest = divmod(tensor.numel(), chunk) if chunk else (0, 0)
        rows[:full, start:start + chunk] = flat[:full * chunk].view(full, chunk)
        if rest:
            rows[full, start:start + rest] = flat[full * chunk:]
        start += chunk
    summed = torch.empty(rows.shape[1], dtype=torch.float32, device=device)
    dist.reduce_scatter_fn(summed, rows.view(-1))
    # The mean's factor and each dtype's rounding in one kernel per dtype over the whole result, the product taken in
    # fp32 and rounded once on the way out; every tensor gets a view of its own values, as reduce_scatter_coalesced
    # hands out views of one buffer.
    rounded = {}
    for dtype in {t.dtype for t in tensors} - {torch.float32}:
        rounded[dtype] = torch.mul(summed, factor, out=torch.empty(summed.shape, dtype=dtype, device=device))
    if any(t.dtype == torch.float32 for t in tensors):
        rounded[torch.float32] = summed.mul_(factor)
    results, start = [], 0
    for tensor, chunk in zip(tensors, chunks):
        mine = _partition(tensor.numel(), world, rank)[1]
        results.append(rounded[tensor.dtype][start:start + mine])
        start += chunk
    return results


def encode(gradient, topology, padded_chunk, feedback=None, kernels=None):
    """The blocks ``gradient`` sends in qgZ's first all-to-all; ``feedback`` (LoCo): None, or the error feedback of
    the first and of the second quantization (``int4.Feedback``; the second is None with one rank per node, where
    the gradient is quantized once). ``kernels``: the backend module to use (default ``codec`` of the gradient's
    device; a batch looks it up once)."""
    world, local_size, nodes = topology.world, topology.local_size, topology.nodes
    flat = gradient.reshape(-1).contiguous()
    first = feedback[0] if feedback else None
    # One rank per node: block d (chunk d) goes straight to node d. Otherwise local peer j gets row m = chunk
    # m * L + j, for every node m.
    destinations, rows = (nodes, 1) if local_size == 1 else (local_size, nodes)
    kernels = kernels or codec(gradient.device)
    return kernels.qgz_encode(flat, destinations, rows, _partition(flat.numel(), world, 0)[0], padded_chunk, first)


def _exchange(blocks, group):
    """One all-to-all for several gradients' blocks (``[peers, bytes]`` each; the list is emptied, so that only the
    concatenation stays alive): row p of their concatenation goes to peer p. Returns each gradient's received blocks,
    ``[sources, bytes]``, contiguous."""
    return _received(_send(blocks, group))


def _send(blocks, group):
    """:func:`_exchange`'s all-to-all, launched without the current stream waiting for it: (received rows, work,
    each gradient's width)."""
    widths = [b.shape[1] for b in blocks]
    sent = blocks.pop() if len(blocks) == 1 else torch.cat(blocks, dim=1)
    blocks.clear()
    return (*_all_to_all(sent, group, async_op=True), widths)


def _received(sending):
    """Each gradient's received blocks of a :func:`_send`, once its all-to-all is done."""
    received, work, widths = sending
    work.wait()
    if len(widths) == 1:
        return [received]
    return [part.contiguous() for part in received.split(widths, dim=1)]


def _start_batch(gradients, padded, feedbacks, topology, groups):
    """A batch of gradients (``padded``: each one's padded chunk) through qgZ's first stage, within the node, and its
    inter-node all-to-all launched, every stage's all-to-all shared by the whole batch: what :func:`_finish_batch`
    needs. The current stream does not wait for that all-to-all, so the next batch's first stage runs while it is
    on the link."""
    world, local_size, nodes, rank = topology.world, topology.local_size, topology.nodes, topology.rank
    node, local = divmod(rank, local_size)
    kernels = codec(gradients[0].device)
    blocks = [encode(g, topology, p, f, kernels) for g, p, f in zip(gradients, padded, feedbacks)]
    if local_size > 1:
        # Each local peer sums what its peers sent and re-encodes one row per node.
        received = _exchange(blocks, groups[f"local_{node}"])
        blocks = [
            kernels.qgz_reduce_encode(r, nodes, p, f[1] if f else None)
            for r, p, f in zip(received, padded, feedbacks)
        ]
        del received
    # Across nodes (ranks with the same local index): node m gets the node sums of its chunk.
    sending = _send(blocks, groups[f"global_{local}"])
    mine = [_partition(g.numel(), world, rank)[1] for g in gradients]
    return sending, kernels, padded, mine, [g.dtype for g in gradients], topology.factor


def _finish_batch(started):
    """The decoded chunks of a :func:`_start_batch`."""
    sending, kernels, padded, mine, dtypes, factor = started
    return [
        kernels.qgz_decode_sum(r, p, m, factor, dtype)
        for r, p, m, dtype in zip(_received(sending), padded, mine, dtypes)
    ]


def batches(sizes, limit):
    """Consecutive runs of indices whose sizes add up to at most ``limit`` (an item larger than it alone)."""
    batch, total = [], 0
    for index, size in enumerate(sizes):
        if batch and total + size > limit:
            yield batch
            batch, total = [], 0
        batch.append(index)
        total += size
    if batch:
        yield batch


def sent_bytes(padded_chunk, world):
    """Bytes one rank sends of a gradient in each of qgZ's all-to-alls: what a batch's size counts."""
    return world * block_bytes(1, padded_chunk)


def _reduce_scatter_quantized(gradients, feedbacks, topology, groups, on_read=None):
    """This rank's mean-reduced chunk of each gradient, in batches of at most ``BATCH_BYTES`` sent per rank: every
    batch started (:func:`_start_batch`), then every one finished, so that the inter-node all-to-alls follow one
    another on the link. ``on_read()`` runs between the two, once the gradients are no longer read."""
    world = topology.world
    padded = [padded_chunk_of(g.numel(), world) for g in gradients]
    started = []
    for batch in batches([sent_bytes(p, world) for p in padded], BATCH_BYTES):
        picked = [gradients[i] for i in batch], [padded[i] for i in batch], [feedbacks[i] for i in batch]
        started.append(_start_batch(*picked, topology, groups))
    if on_read is not None:
        on_read()
    return [chunk for batch in started for chunk in _finish_batch(batch)]


class Topology(NamedTuple):
    """Where this rank stands in the job, as qgZ's two stages see it."""
    world: int
    local_size: int  # ranks per node
    nodes: int
    rank: int
    factor: float  # the mean's factor, 1 / world, as an fp32 value for both codecs


def topology():
    """The :class:`Topology` of the current process group."""
    from deepspeed import comm as dist
    from deepspeed.accelerator import get_accelerator
    world, local_size = dist.get_world_size(), get_accelerator().device_count()
    return Topology(world, local_size, world // local_size, dist.get_rank(), mean_factor(world))


def mean_factor(world):
    """1 / ``world`` rounded to the nearest fp32 value (the mean's factor of both codecs), computed on the host: no
    tensor, so nothing to launch or wait for."""
    return struct.unpack("f", struct.pack("f", 1.0 / world))[0]


def padded_chunk_of(numel, world):
    """Values per rank of a ``numel``-value gradient, padded to whole 4-bit groups."""
    return math.ceil(_partition(numel, world, 0)[0] / GROUP) * GROUP


def reduce_scatter(tensors, groups, topology, feedbacks=None, on_read=None):
    """This rank's mean-reduced partition of every tensor (4-bit or unquantized: see :func:`quantizes`);
    ``feedbacks``: None, or one entry per tensor for :func:`encode` (ignored for unquantized ones). ``on_read``:
    None, or a callable run once every read of ``tensors`` has been issued on the current stream (the inter-node
    all-to-alls and the decode still to come), where the caller may start overwriting them in stream order."""
    world, rank, factor = topology.world, topology.rank, topology.factor
    feedbacks = feedbacks or [None] * len(tensors)
    four_bit = [i for i, t in enumerate(tensors) if quantizes(t, world)]
    plain = [i for i, t in enumerate(tensors) if not quantizes(t, world)]
    reduced = reduce_scatter_plain([tensors[i] for i in plain], world, rank, factor)
    reduced += _reduce_scatter_quantized([tensors[i] for i in four_bit], [feedbacks[i] for i in four_bit], topology,
                                         groups, on_read)
    results = [None] * len(tensors)
    for i, result in zip(plain + four_bit, reduced):
        results[i] = result
    return results


@torch.no_grad()
def all_to_all_quant_reduce(tensors, groups, on_read=None):
    """Drop-in for DeepSpeed's ``all_to_all_quant_reduce(tensors, groups)``: this rank's mean-reduced partition of
    every tensor, in the tensor's own dtype (4-bit or unquantized: see :func:`quantizes`). ``groups`` is
    DeepSpeed's all-to-all group dict (``local_{node}``, ``global_{local index}``); ``on_read``: as
    :func:`reduce_scatter`'s."""
    return reduce_scatter(tensors, groups, topology(), on_read=on_read)
