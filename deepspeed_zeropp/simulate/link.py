"""The link model: what one collective costs, and how that cost is put on the GPU's timeline.

A collective over a group of ``n`` ranks moves, per rank, the bytes of NCCL's ring algorithm (``S``: the gathered or
reduced buffer, all ranks' data):

| collective | hops | bytes each rank sends |
|---|---|---|
| all-gather, reduce-scatter | n - 1 | (n - 1) / n * S |
| all-reduce (reduce-scatter, then all-gather) | 2 (n - 1) | 2 (n - 1) / n * S |
| all-to-all | n - 1 | (n - 1) / n * S |
| broadcast (pipelined ring) | n - 1 | S |

A group inside one node runs at the intra-node link's ``alpha`` (per hop) and ``beta`` (a GPU's NVLink bandwidth):
``hops * alpha + bytes / beta``. A group spanning ``k`` nodes with ``m`` of its ranks on each (``n = k * m``), every
GPU with a NIC of its own (``inter.beta``):

- ring collectives (all-gather, reduce-scatter, all-reduce, broadcast, barrier): the ring crosses a node boundary on
  ``k`` of its ``n`` edges, its other edges are NVLink. NCCL runs one ring per channel and spreads the channels
  over the node's NICs, so the bytes that cross out of a node (a rank's ring share, once per ring) leave through
  all ``m`` NICs of the group's ranks there: the ring's bandwidth is ``min(m * inter.beta, intra.beta)`` (what
  nccl-tests report as bus bandwidth across nodes: the node's NICs together, not one GPU's), and the latency of a
  pass around it is ``k`` inter-node hops and ``n - 1 - k`` NVLink hops (pipelined chunks pay each edge once).
  ZeRO-3's world-wide all-gathers and reduce-scatters have ``m`` = GPUs per node; qgZ's inter-node groups, one rank
  per node, ``m`` = 1.
- all-to-all: each rank sends ``(n - m) / n * S`` through its own NIC and ``(m - 1) / n * S`` over NVLink, at once;
  ``n - 1`` inter-node hops.

Left out: NCCL's own use of SMs and memory bandwidth (only the simulated copies run), several communicators
sharing one NIC at the same time (each group's collectives queue on its own stream and get the full bandwidth:
in backward, qgZ's inter-node all-to-alls share the NIC with the world group's all-gathers; timeline.py's
concurrent time bounds what that leaves out), protocol and chunking effects (LL vs Simple), and the host's launch
cost of NCCL (the simulated group's host cost stands in for it).
"""
from typing import NamedTuple

import torch

# The link model's version, written into every result: 2 since rings across nodes send through every NIC of their
# ranks on a node; results of version 1 (none written) charged every ring at one GPU's NIC.
MODEL_VERSION = 2


class LinkClass(NamedTuple):
    alpha_us: float  # latency per ring hop
    gbit_per_s: float  # a GPU's share of the link's bandwidth, Gbit/s

    @property
    def bytes_per_s(self):
        return self.gbit_per_s * 1e9 / 8


HOPS_AND_TRAFFIC = {  # kind -> (hops per n - 1 ranks, bytes sent per (n - 1) / n of S)
    "all_gather": (1, 1),
    "reduce_scatter": (1, 1),
    "all_to_all": (1, 1),
    "all_reduce": (2, 2),
    "barrier": (2, 0),
}


def wire_bytes(kind, nbytes, n):
    """Bytes one rank sends in a ring collective over ``n`` ranks moving ``nbytes`` in all (the table above)."""
    if kind == "broadcast":
        return nbytes
    return HOPS_AND_TRAFFIC[kind][1] * (n - 1) / n * nbytes


class Link(NamedTuple):
    intra: LinkClass
    inter: LinkClass
    name: str = "custom"
    device_bytes_per_s: float = 3.0e12  # the simulated copy's own speed, taken off the modelled delay

    def seconds(self, kind, nbytes, n, link_class, nodes=None):
        """The modelled time of one collective over ``n`` ranks moving ``nbytes`` in all; ``nodes``: how many nodes
        an inter-node group spans (default ``n``: one rank per node), its ranks spread evenly over them."""
        factor, traffic = HOPS_AND_TRAFFIC.get(kind, (1, 1))
        if link_class == "intra":
            return factor * (n - 1) * self.intra.alpha_us * 1e-6 + wire_bytes(kind, nbytes, n) / self.intra.bytes_per_s
        nodes = n if nodes is None else nodes
        per_node = n // nodes
        if kind == "all_to_all":
            out = traffic * nbytes / n
            return ((n - 1) * self.inter.alpha_us * 1e-6 + max((n - per_node) * out / self.inter.bytes_per_s,
                                                               (per_node - 1) * out / self.intra.bytes_per_s))
        inter_hops = min(nodes, n - 1)
        latency = factor * (inter_hops * self.inter.alpha_us + (n - 1 - inter_hops) * self.intra.alpha_us) * 1e-6
        return latency + wire_bytes(kind, nbytes, n) / min(per_node * self.inter.bytes_per_s, self.intra.bytes_per_s)

    def describe(self):
        return (
            f"{self.name}: intra-node {self.intra.gbit_per_s:g} Gbit/s per GPU, {self.intra.alpha_us:g} us per hop; "
            f"inter-node {self.inter.gbit_per_s:g} Gbit/s per GPU, {self.inter.alpha_us:g} us per hop")


NVLINK = LinkClass(alpha_us=2.0, gbit_per_s=8 * 360)  # H100/H200 NVLink: ~360 GB/s of ring bandwidth per GPU


class Delay:
    """Sleeps a CUDA stream for a given time, with torch's spin kernel (``torch.cuda._sleep``, in clock cycles)
    calibrated once against CUDA events."""

    def __init__(self):
        self.cycles_per_s = self.calibrate()

    @staticmethod
    def calibrate(cycles=20_000_000, trials=5):
        rates = []
        torch.cuda._sleep(1000)
        for _ in range(trials):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            torch.cuda._sleep(cycles)
            end.record()
            end.synchronize()
            rates.append(cycles / (start.elapsed_time(end) * 1e-3))
        return sorted(rates)[len(rates) // 2]

    def sleep(self, seconds):
        if seconds > 0:
            torch.cuda._sleep(int(seconds * self.cycles_per_s))
