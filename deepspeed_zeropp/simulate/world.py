"""A simulated world: this process is rank 0 of an N-rank job, through a process-group backend of its own.

Only the process group and the accelerator's device count are replaced; DeepSpeed and the patch run unchanged,
with the shapes of the real job (a 1/N shard, full-size gathered buffers).

Values stay realistic: every other rank is taken to hold what this rank holds. An all-gather tiles this rank's
input N times, a sum multiplies by N (DeepSpeed's mean then divides it back), a reduce-scatter hands back N times
this rank's own chunk, an all-to-all fills every peer's slot with what this rank sends itself. Gathered weights,
reduced gradients and qgZ's 4-bit blocks are therefore the values one real rank would see if all ranks agreed,
never fill-in garbage (which makes DeepSpeed skip every qgZ step as an overflow).

Every collective is counted (by kind, dtype and link class) and, where a link model is set, costs its modelled time
on the GPU timeline: it runs on a stream of its process group, as NCCL runs on its communicator's stream, so
DeepSpeed's overlap of communication with compute is what gets measured.
"""
import collections
import os
from typing import NamedTuple, Optional

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import ReduceOp, _create_work_from_future

import deepspeed_zeropp

from .link import Delay, wire_bytes

BACKEND = "zeropp_sim"
INTRA, INTER = "intra", "inter"  # link classes: a group inside one node, or one spanning nodes


class Topology(NamedTuple):
    world_size: int
    gpus_per_node: int

    @property
    def nodes(self):
        return self.world_size // self.gpus_per_node

    def nodes_of(self, global_ranks):
        """How many nodes ``global_ranks`` span."""
        return len({r // self.gpus_per_node for r in global_ranks})

    def link_class(self, global_ranks):
        return INTRA if self.nodes_of(global_ranks) == 1 else INTER

    def check(self):
        if self.world_size < 2 or self.gpus_per_node < 1 or self.world_size % self.gpus_per_node:
            raise ValueError(f"a simulated world needs world_size >= 2 that gpus_per_node divides; got world_size "
                             f"{self.world_size}, gpus_per_node {self.gpus_per_node}")


class _State:
    """What the groups of the one simulated world share: topology, link model, counts."""
    topology: Optional[Topology] = None
    store = None
    link = None  # link.Link, or None: collectives cost only their copies
    delay = None  # link.Delay that realises modelled times on a stream
    counts = collections.Counter()  # (kind, dtype, link class) -> calls
    wire_bytes = collections.Counter()  # link class -> bytes this rank sends
    modelled_us = collections.Counter()  # link class -> modelled time
    log = None  # a list to append every collective's (kind, bytes, ranks, link class, nodes) to, or None


STATE = _State()


def reset_counts():
    STATE.counts.clear()
    STATE.wire_bytes.clear()
    STATE.modelled_us.clear()


def set_link(link):
    """The link model for the collectives from now on (None: free)."""
    if link is not None and STATE.delay is None:
        STATE.delay = Delay()
    STATE.link = link


class SimulatedGroup(dist.ProcessGroup):
    """One group of the simulated world (the world itself, hpZ's node groups, qgZ's intra/inter-node groups).

    Each collective's copies run on this group's own CUDA stream after the caller's stream has reached the call;
    the returned work makes the caller's stream wait for them, as NCCL's work does."""

    def __init__(self, rank, size, global_ranks):
        super().__init__(rank, size)
        self._rank, self._size = rank, size
        self.global_ranks = list(global_ranks) or list(range(size))
        self.link_class = STATE.topology.link_class(self.global_ranks)
        self.nodes = STATE.topology.nodes_of(self.global_ranks)
        self._stream = None

    def getBackendName(self):
        return BACKEND

    def size(self):
        return self._size

    # -- the collectives DeepSpeed calls; each name torch has used for them maps to one implementation --

    def allgather(self, output_lists, input_tensors, opts=None):

        def copy():
            for outputs, tensor in zip(output_lists, input_tensors):
                for out in outputs:
                    out.copy_(tensor)

        return self._run("all_gather", input_tensors[0], self._size * input_tensors[0].numel(), copy,
                         [t for outs in output_lists for t in outs], input_tensors)

    def all_gather_single(self, output, input, opts=None):

        def copy():
            _tile(output, input, self._size)

        return self._run("all_gather", input, output.numel(), copy, [output], [input])

    _allgather_base = all_gather_single

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):

        def copy():
            for output, tensor in zip(outputs, inputs):
                _tile(output, tensor, self._size)

        return self._run("all_gather", inputs[0], sum(o.numel() for o in outputs), copy, outputs, inputs)

    all_gather_single_coalesced = allgather_into_tensor_coalesced

    def allreduce(self, tensors, opts=None):
        op = _reduce_op(opts)

        def scale():
            if op == ReduceOp.SUM:
                for tensor in tensors:
                    tensor.mul_(self._size)

        return self._run("all_reduce", tensors[0], sum(t.numel() for t in tensors), scale, tensors)

    allreduce_coalesced = allreduce

    def reduce_scatter(self, outputs, input_lists, opts=None):
        op = _reduce_op(opts)

        def reduce():
            for output, inputs in zip(outputs, input_lists):
                _reduced_copy(output, inputs[self._rank], self._size, op)

        return self._run("reduce_scatter", outputs[0], self._size * outputs[0].numel(), reduce, outputs,
                         [t for inputs in input_lists for t in inputs])

    def reduce_scatter_single(self, output, input, opts=None):
        op = _reduce_op(opts)

        def reduce():
            _reduced_copy(output, input.reshape(self._size, -1)[self._rank], self._size, op)

        return self._run("reduce_scatter", output, input.numel(), reduce, [output], [input])

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        op = _reduce_op(opts)

        def reduce():
            for output, tensor in zip(outputs, inputs):
                _reduced_copy(output, tensor.reshape(self._size, -1)[self._rank], self._size, op)

        return self._run("reduce_scatter", outputs[0], sum(t.numel() for t in inputs), reduce, outputs, inputs)

    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):

        def exchange():
            if not input_split_sizes and not output_split_sizes:  # equal parts: one copy, as NCCL's one launch
                _tile(output, input.view(self._size, -1)[self._rank], self._size)
                return
            sends = _split(input, input_split_sizes, self._size)
            own = sends[self._rank].reshape(-1)
            for slot in _split(output, output_split_sizes, self._size):
                slot = slot.reshape(-1)
                n = min(slot.numel(), own.numel())
                slot[:n].copy_(own[:n])
                slot[n:].zero_()

        return self._run("all_to_all", input, input.numel(), exchange, [output], [input])

    alltoall_base = all_to_all_single

    def alltoall(self, outputs, inputs, opts=None):

        def exchange():
            for out in outputs:
                out.copy_(inputs[self._rank])

        return self._run("all_to_all", inputs[0], sum(t.numel() for t in inputs), exchange, outputs, inputs)

    def broadcast(self, tensors, opts=None):
        # Every rank holds what this one holds, so what the root sends is already here.
        return self._run("broadcast", tensors[0], sum(t.numel() for t in tensors), None, tensors)

    def barrier(self, opts=None):
        return self._run("barrier", None, 0, None, [])

    # -- one collective --

    def _run(self, kind, sample, numel, work, outputs, inputs=()):
        """Count, copy and delay one collective that writes ``outputs`` (its work's result, which the waiter's
        stream is synchronised with) and reads ``inputs``. Both are kept from the allocator until the group's
        stream is done with them, as NCCL keeps them; the work holds the outputs only, as NCCL's does (holding the
        inputs too would tie them to whatever holds the work, in cycles only the garbage collector breaks)."""
        dtype = str(sample.dtype).replace("torch.", "") if sample is not None else "-"
        STATE.counts[(kind, dtype, self.link_class)] += 1
        nbytes = numel * (sample.element_size() if sample is not None else 0)
        STATE.wire_bytes[self.link_class] += wire_bytes(kind, nbytes, self._size)
        if STATE.log is not None:
            STATE.log.append((kind, nbytes, self._size, self.link_class, self.nodes))
        link = STATE.link
        if link is not None:
            seconds = link.seconds(kind, nbytes, self._size, self.link_class, self.nodes)
            STATE.modelled_us[self.link_class] += seconds * 1e6
        device = next((t.device for t in outputs if t.is_cuda), None)
        if device is None:  # CPU: the copies now, no modelled time (nothing to overlap with)
            if work is not None:
                work()
            return _completed(outputs, None)
        caller = torch.cuda.current_stream(device)
        if self._stream is None:
            self._stream = torch.cuda.Stream(device)
        self._stream.wait_stream(caller)
        with torch.cuda.stream(self._stream):
            if work is not None:
                work()
            if link is not None:
                STATE.delay.sleep(seconds - 2 * nbytes / link.device_bytes_per_s)  # the copy took part of it
            for tensor in (*outputs, *inputs):
                tensor.record_stream(self._stream)
            return _completed(outputs, device)


def _completed(tensors, device):
    future = torch.futures.Future(devices=[device] if device is not None else None)
    future.set_result(tensors)  # on a CUDA stream: records its event; wait() makes the waiting stream wait
    return _create_work_from_future(future)


def _tile(output, input, size):
    """``output`` (``size`` slots) := ``input`` in every slot; DeepSpeed gathers in place (``input`` one of them)."""
    source = input.reshape(1, -1)
    if source.untyped_storage().data_ptr() == output.untyped_storage().data_ptr():
        source = source.clone()
    output.view(size, -1).copy_(source)


def _reduce_op(opts):
    op = getattr(opts, "reduceOp", ReduceOp.SUM)
    return getattr(op, "op", op)


def _reduced_copy(output, own_chunk, size, op):
    output.view(-1).copy_(own_chunk.reshape(-1))
    if op == ReduceOp.SUM:
        output.mul_(size)


def _split(tensor, sizes, parts):
    flat = tensor.view(-1)
    if not sizes:
        return list(flat.view(parts, -1))
    row = flat.numel() // sum(sizes) if sum(sizes) else 0
    return list(flat.split([s * row for s in sizes]))


class MirrorStore(dist.Store):
    """The job's key-value store, where the simulated ranks publish what this rank publishes: a key naming rank 0
    (a path part ``rank0``) is also set for every other rank. Nothing else answers: a wait for a key nobody set
    fails at once instead of hanging."""

    def __init__(self, world_size):
        super().__init__()
        self.world_size = world_size
        self.values = {}

    def set(self, key, value):
        value = value.encode() if isinstance(value, str) else bytes(value)
        parts = key.split("/")
        self.values[key] = value
        if "rank0" in parts:
            for rank in range(1, self.world_size):
                self.values["/".join(f"rank{rank}" if p == "rank0" else p for p in parts)] = value

    def get(self, key):
        self.wait([key])
        return self.values[key]

    def add(self, key, amount):
        value = int(self.values.get(key, b"0")) + amount
        self.values[key] = str(value).encode()
        return value

    def check(self, keys):
        return all(k in self.values for k in keys)

    def wait(self, keys, timeout=None):
        missing = [k for k in keys if k not in self.values]
        if missing:
            raise RuntimeError(f"simulated world: no rank sets {missing} (only rank 0 runs)")

    def delete_key(self, key):
        return self.values.pop(key, None) is not None

    def num_keys(self):
        return len(self.values)

    def clone(self):  # torch hands each user of the store a clone; here they all share the one process's keys
        return self


def _create(common, backend_options):
    return SimulatedGroup(common.group_rank, common.group_size, common.global_ranks_in_group)


def install(world_size, gpus_per_node, device):
    """Make this process rank 0 of ``world_size`` ranks, ``gpus_per_node`` per node, for DeepSpeed.

    - torch.distributed's default group is a :class:`SimulatedGroup`, over a :class:`MirrorStore`;
    - DeepSpeed's accelerator reports ``gpus_per_node`` devices, so it builds qgZ's and hpZ's groups as on a cluster
      of that shape (this process still uses one device, its LOCAL_RANK 0)."""
    topology = Topology(world_size, gpus_per_node)
    topology.check()
    if dist.is_initialized():
        raise RuntimeError("torch.distributed is already initialised; a simulated world needs a fresh process")
    STATE.topology = topology
    reset_counts()
    os.environ.update(RANK="0",
                      LOCAL_RANK="0",
                      WORLD_SIZE=str(world_size),
                      MASTER_ADDR="127.0.0.1",
                      MASTER_PORT="29500")
    # No LOCAL_SIZE: the node's shape is the device count replaced below, and where LOCAL_SIZE equals the world size
    # DeepSpeed's CPU backend sets up its shared-memory collectives and waits for the other ranks, which never come.
    os.environ.pop("LOCAL_SIZE", None)
    deepspeed_zeropp.register_in_order_backend(
        BACKEND)  # each group's collectives run on its one stream, in order, as NCCL's
    if BACKEND not in dist.Backend.backend_list:
        dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["cpu", "cuda"])
    STATE.store = MirrorStore(world_size)  # held here: torch keeps only the C++ side, which needs the Python one
    dist.init_process_group(BACKEND, store=STATE.store, rank=0, world_size=world_size)
    from deepspeed.accelerator import get_accelerator
    accelerator = get_accelerator()
    accelerator.device_count = lambda: gpus_per_node  # the one replacement besides the group: the node's shape
    if device == "cuda":
        torch.cuda.set_device(0)
    return topology
