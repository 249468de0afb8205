"""qgZ's reduce-scatter for all ranks in one process: the collective's data movement (all-to-all = taking block
j of every sender) around a codec module (``qgz_encode``, ``qgz_reduce_encode``, ``qgz_decode_sum``).

Mirrors the 4-bit path of deepspeed_zeropp.qgz step for step (for any tensor, whatever ``qgz.quantizes`` says), so
codecs can be compared on whole reductions without processes; with ``feedbacks``, LoCo's error feedback as
deepspeed_zeropp.loco passes it (per rank: the first quantization's and the node sum's ``Feedback``). Also the test
gradients of the qgZ and LoCo kernel tests.
"""
import math

import torch

from deepspeed_zeropp.backends import torch_ref
from deepspeed_zeropp.formats.int4 import GROUP


def geometry(numel, world):
    chunk = math.ceil(numel / world)
    return chunk, math.ceil(chunk / GROUP) * GROUP


def bound_of_largest(local_size):
    """The mean's error over the largest gradient value: each 4-bit rounding errs by at most half a step (a 14th of
    its group's absmax). Stage 1 rounds each rank's values (absmax <= largest); stage 2, when there is one, each node's
    sum of ``local_size`` of them (absmax <= local_size * largest * 15/14); the mean divides the sum of all by world."""
    return (1 if local_size == 1 else 1 + 15 / 14) / 14 * (1 + 1e-5)


def reduce_scatter(gradients, local_size, codec, feedbacks=None):
    """Every rank's partition of the mean of ``gradients`` (one per rank, rank = node * local_size + local).
    ``feedbacks``: None, or per rank a pair (first, second) of ``int4.Feedback`` (second None when
    local_size == 1), whose errors are updated in place."""
    world = len(gradients)
    nodes = world // local_size
    numel = gradients[0].numel()
    chunk, padded = geometry(numel, world)
    flats = [g.reshape(-1).contiguous() for g in gradients]
    feedbacks = feedbacks or [(None, None)] * world
    if local_size == 1:
        sent = [codec.qgz_encode(flat, nodes, 1, chunk, padded, fb[0]) for flat, fb in zip(flats, feedbacks)]
    else:
        sent = [codec.qgz_encode(flat, local_size, nodes, chunk, padded, fb[0]) for flat, fb in zip(flats, feedbacks)]
        sent = [
            codec.qgz_reduce_encode(torch.stack([sent[node * local_size + peer][local] for peer in range(local_size)]),
                                    nodes, padded, feedbacks[node * local_size + local][1]) for node in range(nodes)
            for local in range(local_size)
        ]
    factor = float(torch.tensor(1.0 / world, dtype=torch.float32))
    results = []
    for rank in range(world):
        node, local = divmod(rank, local_size)
        received = torch.stack([sent[m * local_size + local][node] for m in range(nodes)])
        mine = min(max(numel - rank * chunk, 0), chunk)
        results.append(codec.qgz_decode_sum(received, padded, mine, factor, gradients[rank].dtype))
    return results


def gradient(numel, dtype, seed, scale=1.0):
    """Normal values whose 1024-value stretches span six decades (within fp16's range unless scaled)."""
    gen = torch.Generator().manual_seed(seed)
    stretches = math.ceil(numel / 1024)
    magnitude = 10.0**(torch.rand(stretches, 1, generator=gen, dtype=torch.float64) * 6 - 3)
    values = (torch.randn(stretches, 1024, generator=gen, dtype=torch.float64) * magnitude).view(-1)[:numel]
    return (values * scale).to(dtype)


def edge_gradient(dtype):
    """One 256-value group per edge case: zeros, tiny, subnormal (bf16/fp32: absmax below MIN_SCALE), the dtype's
    max, inf, NaN, exact .5 ties, one value among zeros, a constant, +-c."""
    info = torch.finfo(dtype)
    gen = torch.Generator().manual_seed(5)
    noise = lambda: torch.randn(GROUP, generator=gen, dtype=torch.float64)  # noqa: E731
    ramp = torch.arange(GROUP, dtype=torch.float64)
    cases = [
        torch.zeros(GROUP, dtype=torch.float64),
        noise() * 1e-30,
        noise() * info.tiny / 2,
        torch.where(ramp % 3 == 0, info.max, -info.max * torch.rand(GROUP, generator=gen, dtype=torch.float64)),
        torch.where(ramp == 7, math.inf, noise()),
        torch.where(ramp == 0, math.nan, noise()),
        torch.where(ramp == 0, 7.0, (ramp % 11) - 5.5),  # multiplier 1: .5 ties round half to even
        torch.where(ramp == 100, -3.25, 0.0),
        torch.full((GROUP, ), 0.3, dtype=torch.float64),  # decodes exactly: code 7 is the scale itself
        torch.where(ramp % 3 == 0, -1e-3, 1e-3),
    ]
    return torch.cat(cases).to(dtype)


def received_blocks(sources, rows, padded, dtype, seed):
    """What a rank receives in an all-to-all: each source's encoded block (torch codec, CPU)."""
    chunk = padded - 3
    blocks = []
    for source in range(sources):
        x = gradient(rows * chunk, dtype, seed=seed + source, scale=1e3 if dtype != torch.float16 else 1.0)
        blocks.append(torch_ref.qgz_encode(x, 1, rows, chunk, padded)[0])
    return torch.stack(blocks)
