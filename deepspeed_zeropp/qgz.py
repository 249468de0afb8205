"""Quantized gradient reduce-scatter (ZeRO++ qgZ) that is correct for fp16, bf16 and fp32 gradients.

DeepSpeed's ``all_to_all_quant_reduce`` hands every gradient to kernels that read it as fp16 bits, sums the node-local
partials in fp16 and casts the fp16 result back. This keeps its communication pattern (4-bit codes, an all-to-all
inside each node, then one across nodes) but reads each gradient in its own dtype, accumulates every sum in fp32,
and rounds once to the gradient's dtype. The codec (``qgz_wire``: pure torch, any device, gloo; ``csrc/qgz.cu`` for
CUDA tensors, bit for bit the same) is chosen by the patch's backend.

Layout: rank r = node * L + local owns chunk r of the flattened gradient (as ``reduce_scatter_coalesced``), and the
result is the mean over all ranks, as there. Chunks are padded to whole 4-bit groups with zeros. With one rank per
node (L = 1) there is no node-local sum to take, so the node-local all-to-all and its 4-bit rounding are skipped.
"""
import math

import torch

from .backends import resolve_backend
from .qgz_wire import GROUP, dequantize_int4, quantize_int4  # noqa: F401  (the codec, re-exported)


def _codec(device):
    """The backend module serving qgZ on ``device``. "deepspeed" (DeepSpeed's weight op) has no qgZ of its own
    that keeps dtypes, so it is served as "auto"."""
    from .quantizer import QuantizerMethods
    name = QuantizerMethods.backend if QuantizerMethods.backend in ("torch", "cuda") else "auto"
    return resolve_backend(name, device)


def _all_to_all(blocks, group):
    from deepspeed import comm as dist
    received = torch.empty_like(blocks)
    dist.all_to_all_single(received, blocks, group=group)
    return received


def _reduce_scatter_one(gradient, topology, groups):
    world, local_size, nodes, rank, factor = topology
    node, local = divmod(rank, local_size)
    codec = _codec(gradient.device)
    chunk = math.ceil(gradient.numel() / world)
    padded_chunk = math.ceil(chunk / GROUP) * GROUP
    flat = gradient.reshape(-1).contiguous()
    if local_size == 1:
        # One rank per node: block d (chunk d) goes straight to node d.
        blocks = codec.qgz_encode(flat, nodes, 1, chunk, padded_chunk)
    else:
        # Stage 1, inside the node: local peer j gets row m = chunk m * L + j, for every node m; it sums what its
        # peers sent and re-encodes one row per node.
        blocks = codec.qgz_encode(flat, local_size, nodes, chunk, padded_chunk)
        blocks = codec.qgz_reduce_encode(_all_to_all(blocks, groups[f"local_{node}"]), nodes, padded_chunk)
    # Stage 2, across nodes (ranks with the same local index): node m gets the node sums of its chunk.
    received = _all_to_all(blocks, groups[f"global_{local}"])
    mine = min(max(gradient.numel() - rank * chunk, 0), chunk)
    return codec.qgz_decode_sum(received, padded_chunk, mine, factor, gradient.dtype)


@torch.no_grad()
def all_to_all_quant_reduce(tensors, groups):
    """Drop-in for DeepSpeed's ``all_to_all_quant_reduce(tensors, groups)``: this rank's mean-reduced partition of
    every tensor, in the tensor's own dtype. ``groups`` is DeepSpeed's all-to-all group dict (``local_{node}``,
    ``global_{local index}``)."""
    from deepspeed import comm as dist
    from deepspeed.accelerator import get_accelerator
    world, local_size = dist.get_world_size(), get_accelerator().device_count()
    factor = float(torch.tensor(1.0 / world, dtype=torch.float32))  # the mean, as an fp32 value for both codecs
    topology = (world, local_size, world // local_size, dist.get_rank(), factor)
    return [_reduce_scatter_one(t, topology, groups) for t in tensors]
