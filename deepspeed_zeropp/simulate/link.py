"""The link model: what one collective costs, and how that cost is put on the GPU's timeline.

A collective over a group of ``n`` ranks costs ``hops * alpha + wire_bytes / beta`` with NCCL's ring algorithm:

| collective | hops | bytes each rank sends (``S``: the gathered or reduced buffer, all ranks' data) |
|---|---|---|
| all-gather, reduce-scatter | n - 1 | (n - 1) / n * S |
| all-reduce (reduce-scatter, then all-gather) | 2 (n - 1) | 2 (n - 1) / n * S |
| all-to-all | n - 1 | (n - 1) / n * S |
| broadcast (pipelined ring) | n - 1 | S |

A group inside one node runs at the intra-node link's ``alpha``, ``beta`` (NVLink); a group spanning nodes at the
inter-node link's, which bounds the ring. ``beta`` is a GPU's share of its link: a node's network bandwidth over
its GPUs, since all of a node's GPUs cross it at once in ZeRO-3's world-wide collectives.

Left out: NCCL's own use of SMs and memory bandwidth (only the simulated copies run), several communicators
sharing one link at the same time (each group's collectives queue on its own stream and get the full bandwidth;
timeline.py's concurrent time bounds what that leaves out), protocol and chunking effects (LL vs Simple), and the
host's launch cost of NCCL (the simulated group's host cost stands in for it).
"""
from typing import NamedTuple

import torch


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

    def seconds(self, kind, nbytes, n, link_class):
        """The modelled time of one collective over ``n`` ranks moving ``nbytes`` in all."""
        link = self.intra if link_class == "intra" else self.inter
        hops = HOPS_AND_TRAFFIC.get(kind, (1, 1))[0] * (n - 1)
        return hops * link.alpha_us * 1e-6 + wire_bytes(kind, nbytes, n) / link.bytes_per_s

    def describe(self):
        return (
            f"{self.name}: intra-node {self.intra.gbit_per_s:g} Gbit/s per GPU, {self.intra.alpha_us:g} us per hop; "
            f"inter-node {self.inter.gbit_per_s:g} Gbit/s per GPU, {self.inter.alpha_us:g} us per hop")


NVLINK = LinkClass(alpha_us=2.0, gbit_per_s=8 * 360)  # H100/H200 NVLink: ~360 GB/s of ring bandwidth per GPU


def cluster(inter_gbit_per_node, gpus_per_node, inter_alpha_us=8.0, intra=NVLINK, name=None):
    """A cluster whose nodes each have ``inter_gbit_per_node`` of network, shared by their GPUs."""
    share = inter_gbit_per_node / gpus_per_node
    return Link(intra, LinkClass(inter_alpha_us, share), name or f"{inter_gbit_per_node:g} Gbit/s per node")


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
