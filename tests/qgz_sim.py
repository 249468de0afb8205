"""qgZ's reduce-scatter for all ranks in one process: the collective's data movement (all-to-all = taking block
j of every sender) around a codec module (``qgz_encode``, ``qgz_reduce_encode``, ``qgz_decode_sum``).

Mirrors the 4-bit path of deepspeed_zeropp.qgz step for step (for any tensor, whatever ``qgz.quantizes`` says), so
codecs can be compared on whole reductions without processes; with ``feedbacks``, LoCo's error feedback as
deepspeed_zeropp.loco passes it (per rank: the first quantization's and the node sum's ``Feedback``).
"""
import math

import torch

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
