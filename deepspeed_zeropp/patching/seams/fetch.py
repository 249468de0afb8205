"""The fetch protocol: a quantized fetch's codes and scales go out as one packet per rank (``formats/int8.py``,
the wire format in docs/numerics.md), and a bucket's wait writes each parameter's values where it reads them.

Owns all of the protocol's state: which packet's all-gather is under way (:class:`PacketGather`, the handle
DeepSpeed keeps for both of its all-gathers), and which sites must be patched for packets to be sent (the
handles' seams read them). The seams in ``gathers.py`` call in here; nothing else reads or writes that state.

A fetch, as DeepSpeed's closures make it (every release since 0.14.4): quantize the flat partitions of the
parameters (our quantizer returns codes and scales as views of one packet, ``ops.quantize_packed``), all-gather
the codes, then the scales, through ``partition_parameters._dist_allgather_fn``; later wait on the handle, which
dequantizes and splits the gathered buffer per parameter and per rank. Here the codes' call sends the whole
packet and the scales' call sends nothing; a bucket's wait writes each parameter's values of every rank's packet
into a buffer of its own (``ops.dequantize_packed_parts``: one kernel for the bucket on the CUDA backend, one
dequantize and a copy per parameter elsewhere) instead of a narrow per rank and a concatenation.

Within one step a partition is quantized once (:func:`forward_pass`, :func:`backward_pass`,
:func:`quantize_once`): DeepSpeed releases a weight after its forward use when its next use lies beyond
``stage3_max_reuse_distance`` parameters, and gathers it again, either before forward ends (its prefetcher reads
the step's trace into backward's order) or in backward. A later fetch sends the packet the first one made: the
same bytes, one quantize launch fewer (the 1.4B GPT with the HF Trainer's "auto" buckets: 53 of 153 quantizes a
step, 30 in forward and 23 in backward, ``benchmarks/results/zeropp_bound.md``). Past forward only the packets of
weights released then are kept, the ones backward will gather again. And the partitions a forward fetched are
quantized together at the next forward's first fetch of one of them (:func:`quantize_once`'s ``quantize_many``:
one kernel for up to ``backends.cuda.MAX_SEGMENTS``), not one kernel per fetch: their values are read then, as a
fetch would read them, and a later fetch sends the packet if the partition is unchanged, else quantizes it again.
"""
import weakref

import torch

from ... import backends, ops
from ..installed import replaced
from .common import accelerator, own_dtype

FETCH_SITE = "partition_parameters._dist_allgather_fn"  # this seam's row name in patching/sites.py
READERS = ("AllGatherHandle.wait", "AllGatherCoalescedHandle.wait")  # the seams that read packets
FORWARD_SITE = "DeepSpeedEngine.forward"  # from where a partition's packet is kept
BACKWARD_SITE = "DeepSpeedEngine.backward"  # until where
REWRITE_SITE = "Init._partition_param"  # where DeepSpeed rewrites a partition (it forgets the packets)


class PacketGather:
    """The one all-gather of a fetch's packets, returned for both of DeepSpeed's all-gathers (codes, then scales):
    waiting on it again returns at once. ``received`` holds every rank's packet, ``layout`` their ``int8.Packet``."""

    __slots__ = ("work", "received", "layout", "_done")

    def __init__(self, work, received, layout):
        self.work, self.received, self.layout = work, received, layout
        self._done = False

    def wait(self, *args, **kwargs):
        if not self._done:
            self.work.wait(*args, **kwargs)
            self._done = True
        return True


# The packet whose codes went out last and its PacketGather, until its scales come (DeepSpeed sends them next, from
# the same closure); cleared then, so that nothing here keeps a packet alive.
_pending = None


def readers_patched():
    return READERS[0] in replaced and READERS[1] in replaced


def sends_packets():
    """Whether this process sends quantized fetches as packets (the fetch seam and both readers patched): every
    rank of a job must answer the same (the agreement check compares it)."""
    return FETCH_SITE in replaced and readers_patched()


def _alias(unused, received):
    """Point ``unused`` (the receive buffer upstream allocated for the codes, which packets leave unread) at
    ``received``'s memory, freeing its own: its shape and the views upstream takes of it stay valid, and a fetch
    holds no more memory than with two all-gathers. Only a whole, contiguous buffer that fits is re-pointed."""
    if (unused.device == received.device and not unused.requires_grad and unused.storage_offset() == 0
            and unused.is_contiguous() and unused.untyped_storage().nbytes() == unused.numel() <= received.numel()):
        unused.set_(received.untyped_storage(), 0, unused.shape, unused.stride())


def fetch_allgather(original):
    """Why this seam: every fetch closure (bucket, single parameter, hpZ secondary) sends a quantized fetch as two
    all-gathers through this function, the codes and then the scales: twice the collectives of an unquantized
    fetch. Our quantizer returns both as views of one packet per rank and our handle seams read packets, so the
    codes' call sends the whole packet and the scales' call sends nothing. The closures are local functions; this
    module-level function is what they all call by name.

    Seam factory for ``partition_parameters._dist_allgather_fn``. When the codes of a packet come (the packet's
    start, its whole numel, an output of whole ranks), the packet is all-gathered into a new buffer of a packet
    per rank and the ``PacketGather`` returned; the scales of that packet, next, get the same handle and send
    nothing. Upstream's codes receive buffer, never read, shares the packets' memory (``_alias``). Anything else
    (unquantized buckets, stored MixZ++ codes, codes moved off their packet, scales without their codes before
    them), and any call while the handles' seams that read packets are not patched, runs the original."""

    def wrapper(input_tensor, output_tensor, group=None):
        global _pending
        info = ops.packet_of(input_tensor)
        if info is None:
            return original(input_tensor, output_tensor, group)
        pending, _pending = _pending, None
        packet, layout = info.buffer, info.layout
        if input_tensor.dtype == torch.float32:  # the scales
            if pending is not None and pending[0] is info:
                return pending[1]
            return original(input_tensor, output_tensor, group)
        if not (input_tensor.dtype == torch.int8 and input_tensor.data_ptr() == packet.data_ptr()
                and input_tensor.numel() == layout.numel > 0 and output_tensor.numel() % layout.numel == 0
                and readers_patched()):
            return original(input_tensor, output_tensor, group)
        received = torch.empty(output_tensor.numel() // layout.numel * layout.nbytes,
                               dtype=torch.uint8,
                               device=output_tensor.device)
        gather = PacketGather(original(packet, received, group), received, layout)
        _alias(output_tensor, received)
        _pending = (info, gather)
        return gather

    return wrapper


def complete_single(handle, work):
    """Finish ``AllGatherHandle.wait`` for a parameter whose fetch sent packets (``work``, its ``PacketGather``), as
    upstream's wait would leave it: ``data`` the gathered values (every rank's packet, cut to ``ds_numel``) in the
    parameter's own dtype and shape, its status AVAILABLE, the handle complete (the flag 0.19.6+ reads; earlier
    releases have none and get ours)."""
    param = handle._AllGatherHandle__param
    work.wait()
    param.data = ops.dequantize_packed(work.received,
                                       work.layout,
                                       param.ds_shape,
                                       own_dtype(param),
                                       backend=backends.default())
    param.ds_status = type(param.ds_status).AVAILABLE
    handle._AllGatherHandle__complete = True


def complete_bucket(handle, dtypes):
    """Finish ``AllGatherCoalescedHandle.wait`` for a bucket whose fetch sent packets, as upstream's wait would
    leave it: every parameter's ``data`` its gathered values in its own dtype (``dtypes``) and shape, its status
    AVAILABLE, the handle complete. Each parameter gets a buffer of its own (so its memory is freed when DeepSpeed
    releases it, as upstream's).

    Each rank's packet holds its partitions of the bucket's parameters back to back: ``ds_tensor.ds_numel`` each
    (times ``ds_secondary_tensor_num_of_groups`` for the hpZ secondary partitions), the last rank's padded; a
    parameter's values are its part of every rank in rank order, cut to ``ds_numel`` (``ops.dequantize_packed_parts``
    writes each parameter's parts into a buffer of its own). Every tensor made here is made and read on the stream
    current at the wait, so none needs ``record_stream``."""
    work = handle.allgather_handle
    work.wait()
    handle.quantization.quant_handle.wait()
    params = handle.params
    parts = [param.ds_tensor.ds_numel for param in params]
    if handle.use_secondary_tensor:
        parts = [part * param.ds_secondary_tensor_num_of_groups for part, param in zip(parts, params)]
    gathered = ops.dequantize_packed_parts(work.received, work.layout, parts, dtypes, backend=backends.default())
    available = type(params[0].ds_status).AVAILABLE
    for param, values in zip(params, gathered):
        param.data = values.narrow(0, 0, param.ds_numel).view(param.ds_shape)
        param.ds_status = available
    handle.complete = True


# --- One quantize per partition and step ----------------------------------------------------------------------


class _Kept:
    """The packets quantized in the step's forward and backward (``forward_pass``, ``backward_pass``): ``open`` while
    one of them runs (``forward`` while it is the forward), ``packets`` maps id(partition) to (partition, its
    ``_version``, its ``data_ptr()``, (codes, scales)); ``released`` holds the ids of those whose parameter DeepSpeed
    released since it was last gathered; ``fresh`` those made ahead of their fetch and not sent yet. ``fetched``
    maps the id of each partition this forward fetched to (a weak reference, its address, numel and dtype): kept in
    ``plans`` for the forward's engine as it returns, the ``plan`` of that engine's next forward, quantized at once
    (engines whose forwards alternate, as in RLHF, keep a plan each). ``reused`` counts the quantizes saved by
    sending a packet again, ``batched`` the packets made ahead, since the patch was loaded (the tests read them)."""

    def __init__(self):
        self.open = self.forward = False
        self.packets = {}
        self.released = set()
        self.fresh = set()
        self.fetched = {}
        self.plan = {}
        self.plans = weakref.WeakKeyDictionary()
        self.reused = self.batched = 0


KEPT = _Kept()


def forget_packets():
    """Drop every kept packet: a partition may have been written (``Init._partition_param`` with
    ``has_been_updated``), or the step's backward ended."""
    KEPT.packets.clear()
    KEPT.released.clear()
    KEPT.fresh.clear()


def partition_released(partition):
    """DeepSpeed released the gathered parameter of ``partition`` (the partition seam's release path): if its
    packet is kept, a later fetch will want it."""
    if id(partition) in KEPT.packets:
        KEPT.released.add(id(partition))


def _keep_released():
    """As forward returns: keep for backward only the packets of parameters released now, the ones DeepSpeed will
    gather again; a parameter still gathered is not fetched in backward, and its packet would only hold memory.
    A forward without autograd (evaluation) has no backward: it keeps none."""
    if not torch.is_grad_enabled():
        forget_packets()
        return
    for key in [key for key in KEPT.packets if key not in KEPT.released]:
        del KEPT.packets[key]
    KEPT.fresh.intersection_update(KEPT.packets)


def _window(original, keep_after):
    """The wrapper of an engine call (forward, backward) inside which kept packets are sent again: only for an
    engine with qwZ and with the rewrite seam installed (without it a rewritten partition would go unnoticed), the
    outermost call only. ``keep_after`` (forward's): every packet kept before is dropped first, its packets stay
    for the next call (backward), and the partitions it fetched are the plan of the engine's next forward; else,
    and when it raises, they are dropped as it returns."""

    def wrapper(engine, *args, **kwargs):
        if keep_after and not KEPT.open:
            forget_packets()  # whatever ran since the last forward may have written partitions
        if KEPT.open or not engine.zero_quantized_weights():
            return original(engine, *args, **kwargs)
        KEPT.open = REWRITE_SITE in replaced
        if KEPT.open and keep_after:
            KEPT.forward = True
            KEPT.plan, KEPT.fetched = _plan_of(engine, {}), {}
        kept = False
        try:
            result = original(engine, *args, **kwargs)
            kept = keep_after
            return result
        finally:
            if KEPT.forward:
                _plan_of(engine, KEPT.fetched)
            KEPT.open = KEPT.forward = False
            KEPT.plan, KEPT.fetched = {}, {}
            if kept:
                _keep_released()
            else:
                forget_packets()

    return wrapper


def _plan_of(engine, replacement):
    """``engine``'s plan (``KEPT.plans``; {} for none, or for an engine that takes no weak reference), replaced by
    ``replacement``."""
    try:
        plan = KEPT.plans.pop(engine, {})
        KEPT.plans[engine] = replacement
    except TypeError:
        return {}
    return plan


def forward_pass(original):
    """Why this seam: DeepSpeed may gather a weight twice within one step (released after its forward use, gathered
    again for backward before forward ends or in backward), and nothing writes a partition between a forward and its
    backward but ``Init._partition_param`` with ``has_been_updated`` (``GatheredParameters`` with a modifier rank),
    whose seam forgets the packets. The engine's forward is the one call that starts every fetch of a pass, on every
    release, and the optimizer's writes (through ``.data``, which no version counter sees) all lie outside it and
    the backward that follows.

    Seam factory for ``DeepSpeedEngine.forward``: an engine with qwZ first drops every kept packet (whatever came
    before may have written partitions), then keeps a partition's quantized packet from its first fetch and sends
    it again by later ones (:func:`quantize_once`) while its forward runs and while the backward after it runs
    (``backward_pass``). Without qwZ the original runs alone."""
    return _window(original, keep_after=True)


def backward_pass(original):
    """Why this seam: a weight released in forward may be fetched again in backward; the engine's backward is the
    call that spans those fetches (``forward_pass`` says why nothing writes a partition before it).

    Seam factory for ``DeepSpeedEngine.backward``: while an engine with qwZ runs its backward, the packets its
    forward kept are sent again and new ones kept; every packet is dropped as it returns. (A backward run as
    ``loss.backward()`` without the engine reuses nothing; its forward's packets are dropped at the next forward.)"""
    return _window(original, keep_after=False)


def quantize_once(quantize, quantize_many=None):
    """``quantize`` (the quantizer's method), returning inside the engine's forward or backward the packet it
    already made of the same partition in this step: the same tensor object (a parameter's ``ds_tensor``, which has
    ``ds_numel``; a bucket's concatenation is new at every fetch), at the same ``_version`` and address, default
    groups. The kept packet is the one the first fetch all-gathered, unchanged: fetches read it and write only their
    receive buffers.

    ``quantize_many(quantizer, partitions)`` (the quantizer's batch, or None: it may return None): at a forward's
    first fetch of a partition that the forward before fetched, every such partition still at its address, numel
    and dtype is quantized there, in one call, and its packet kept as if that fetch had made it. On an accelerator
    whose streams run apart (CUDA), the fetching stream first waits for the default stream, where DeepSpeed's
    optimizer wrote the partitions, so that the batch reads none of them before those writes whatever DeepSpeed
    ordered for the one partition it fetches."""

    def method(quantizer, param, groups=None):
        if not KEPT.open or groups is not None:
            return quantize(quantizer, param, groups)
        key = id(param)
        if key in KEPT.plan:
            _quantize_planned(quantizer, quantize_many)
        kept = KEPT.packets.get(key)
        KEPT.released.discard(key)  # gathered again now
        if kept is not None and kept[0] is param and kept[1] == param._version and kept[2] == param.data_ptr():
            if key not in KEPT.fresh:
                KEPT.reused += 1
                return kept[3]  # its first fetch in this step noted it
            KEPT.fresh.discard(key)
            result = kept[3]
        else:
            result = quantize(quantizer, param, groups)
            if getattr(param, "ds_numel", None) is None or ops.packet_of(result[0]) is None:
                return result
            KEPT.packets[key] = (param, param._version, param.data_ptr(), result)
        if KEPT.forward:  # its first fetch in this step: the next forward's plan
            KEPT.fetched[key] = (weakref.ref(param), param.data_ptr(), param.numel(), param.dtype)
        return result

    return method


def _quantize_planned(quantizer, quantize_many):
    """Quantize at once the partitions of ``KEPT.plan`` (emptied) that are alive, unchanged in address, numel and
    dtype, and not kept already; keep their packets as ``fresh``."""
    plan, KEPT.plan = KEPT.plan, {}
    if quantize_many is None:
        return
    partitions = []
    for key, (ref, address, numel, dtype) in plan.items():
        partition = ref()
        if (partition is not None and key not in KEPT.packets and partition.data_ptr() == address
                and partition.numel() == numel and partition.dtype == dtype):
            partitions.append(partition)
    if not partitions:
        return
    if partitions[0].device.type != "cpu":
        streams = accelerator()
        if not streams.is_synchronized_device():
            streams.current_stream().wait_stream(streams.default_stream())
    packets = quantize_many(quantizer, partitions)
    if packets is None:
        return
    for partition, packet in zip(partitions, packets):
        if ops.packet_of(packet[0]) is not None:
            key = id(partition)
            KEPT.packets[key] = (partition, partition._version, partition.data_ptr(), packet)
            KEPT.fresh.add(key)
            KEPT.batched += 1
