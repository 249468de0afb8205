"""Quantized gradient reduce-scatter (ZeRO++ qgZ) that is correct for fp16, bf16 and fp32 gradients.

DeepSpeed's ``all_to_all_quant_reduce`` hands every gradient to kernels that read it as fp16 bits, sums the node-local
partials in fp16 and casts the fp16 result back. This keeps its communication pattern (4-bit codes, an all-to-all
inside each node, then one across nodes) but reads each gradient in its own dtype, accumulates every sum in fp32,
and rounds once to the gradient's dtype. Pure torch, so it runs on any device and over gloo.

Layout: rank r = node * L + local owns chunk r of the flattened gradient (as ``reduce_scatter_coalesced``), and the
result is the mean over all ranks, as there. Chunks are padded to whole 4-bit groups with zeros.
"""
import math

import torch

from .wire import FLT_MAX

BITS = 4
LEVELS = 1 << (BITS - 1)  # codes in [-8, 7]; multiplier 8 / absmax, as the 8-bit wire format's 128 / absmax
GROUP = 256  # elements per 4-bit group (even: two codes per byte)


def quantize_int4(values):
    """fp32 values (numel a multiple of GROUP) -> (uint8, two codes per byte; fp32 scales, one per group)."""
    grouped = values.reshape(-1, GROUP)
    absmax = grouped.abs().amax(dim=1)
    finite = torch.isfinite(absmax)
    multiplier = torch.where(absmax == 0, torch.ones_like(absmax), torch.full_like(absmax, float(LEVELS)) / absmax)
    multiplier = multiplier.clamp(max=FLT_MAX)
    codes = (grouped * multiplier.unsqueeze(1)).round_().clamp_(-LEVELS, LEVELS - 1)
    codes = torch.where(finite.unsqueeze(1), codes, torch.zeros_like(codes)).to(torch.int16) & 0xF
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8)
    scales = torch.where(finite, torch.ones_like(multiplier) / multiplier, torch.full_like(absmax, float("nan")))
    return packed.reshape(-1), scales


def dequantize_int4(packed, scales):
    """Inverse of :func:`quantize_int4`, in fp32."""
    nibbles = torch.stack([packed & 0xF, packed >> 4], dim=-1).to(torch.int16)
    codes = torch.where(nibbles >= LEVELS, nibbles - 2 * LEVELS, nibbles).reshape(-1, GROUP)
    return (codes.float() * scales.unsqueeze(1)).reshape(-1)


def _exchange_and_sum(blocks, group, members):
    """Send block i to member i of ``group`` as 4-bit codes; return the fp32 sum of the blocks received."""
    from deepspeed import comm as dist
    packed, scales = quantize_int4(blocks)
    packed_in, scales_in = torch.empty_like(packed), torch.empty_like(scales)
    dist.all_to_all_single(packed_in, packed, group=group)
    dist.all_to_all_single(scales_in, scales, group=group)
    return dequantize_int4(packed_in, scales_in).view(blocks.shape).sum(dim=0)


def _reduce_scatter_one(gradient, topology, groups):
    world, local_size, nodes, rank = topology
    node, local = divmod(rank, local_size)
    chunk = math.ceil(gradient.numel() / world)
    padded_chunk = math.ceil(chunk / GROUP) * GROUP
    flat = torch.zeros(world * chunk, dtype=torch.float32, device=gradient.device)
    flat[:gradient.numel()] = gradient.reshape(-1)  # exact: every fp16/bf16 value is an fp32 value
    chunks = torch.zeros(world, padded_chunk, dtype=torch.float32, device=gradient.device)
    chunks[:, :chunk] = flat.view(world, chunk)
    # Stage 1, inside the node: local peer j receives the chunks of ranks (m, j) for every node m.
    per_peer = chunks.view(nodes, local_size, padded_chunk).transpose(0, 1).contiguous()
    node_sums = _exchange_and_sum(per_peer, groups[f"local_{node}"], local_size)  # [nodes, padded_chunk]
    # Stage 2, across nodes (ranks with the same local index): node m receives the node sums of its chunk.
    total = _exchange_and_sum(node_sums, groups[f"global_{local}"], nodes)
    mine = min(max(gradient.numel() - rank * chunk, 0), chunk)
    return (total[:mine] / world).to(gradient.dtype)


@torch.no_grad()
def all_to_all_quant_reduce(tensors, groups):
    """Drop-in for DeepSpeed's ``all_to_all_quant_reduce(tensors, groups)``: this rank's mean-reduced partition of
    every tensor, in the tensor's own dtype. ``groups`` is DeepSpeed's all-to-all group dict (``local_{node}``,
    ``global_{local index}``)."""
    from deepspeed import comm as dist
    from deepspeed.accelerator import get_accelerator
    world, local_size = dist.get_world_size(), get_accelerator().device_count()
    topology = (world, local_size, world // local_size, dist.get_rank())
    return [_reduce_scatter_one(t, topology, groups) for t in tensors]
