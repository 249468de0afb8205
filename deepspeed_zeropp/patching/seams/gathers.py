"""Seams at DeepSpeed's gathers: the all-gather handles (one parameter, a bucket), the NoGather handles (a partition
group of one rank) and Init's synchronous gathers. Each dequantizes gathered codes; the wrappers tell the patched
quantizer the dtype to hand back and how the codes are laid out (``scope.dequant_target``). A fetch that sent
packets (``fetch.py``, the fetch protocol) is completed there, a parameter's or a bucket's."""
import contextlib

import torch

from ...formats.grouping import blocks_of
from ..scope import dequant_target
from . import coalesced, fetch
from .fetch import PacketGather
from .common import bucket_dtype, dtype_scoped, own_dtype, restore_dtypes, stored_quantized, weights_quantized


def _single_quantization(handle, *args, **kwargs):
    return getattr(handle, "_AllGatherHandle__quantization", None)


def _partition_numel(partition):
    return getattr(partition, "ds_numel", partition.numel())


def _single_layout(handle, *args, **kwargs):
    """The sequential path narrows the gathered buffer to ``ds_numel``, so the per-rank blocks cannot be read off
    the codes (upstream divides by the scale count: scales land on the wrong elements when the partition is
    padded). Each rank quantized the partition it all-gathered: the hpZ secondary one where the parameter has it,
    as upstream picks it; its numel gives the codes' ``GatheredLayout``, computed here. (A fetch that sent packets
    never gets here: the wrapper hands it to the fetch protocol.)"""
    param = handle._AllGatherHandle__param
    secondary = getattr(param, "ds_secondary_tensor", None)
    block_numel = _partition_numel(secondary if secondary is not None else param.ds_tensor)
    return {"layout": blocks_of(block_numel) if block_numel else None}


_single_scoped = dtype_scoped(lambda handle, *a, **k: [handle._AllGatherHandle__param],
                              lambda handle, *a, **k: _single_quantization(handle) is not None, _single_layout)


def single_gather(original):
    """Why this seam: AllGatherHandle.wait dequantizes one gathered parameter; before 0.19.6 without a dtype (fp16
    back), and for padded partitions with the wrong scale-to-element mapping. Wrapping wait reaches the handle
    after the all-gather, where the parameter and its gathered buffer are both known.

    Seam factory for ``AllGatherHandle.wait``. A fetch that sent packets is completed by the fetch protocol
    (``fetch.complete_single``: one dequantize of the packets, none of upstream's steps in between); other
    quantized fetches (stored MixZ++ codes) run the original under dtype_scoped's dequantize target."""
    scoped = _single_scoped(original)

    def wrapper(handle, *args, **kwargs):
        if getattr(handle, "_AllGatherHandle__complete", False):
            # upstream's flag (0.19.6+, whose wait then returns at once) or ours, set on every release by
            # complete_single: before 0.19.6 a second wait would dequantize again, outside any dequantize target
            return None
        work = getattr(handle, "_AllGatherHandle__handle", None)
        if type(work) is PacketGather:
            return fetch.complete_single(handle, work)
        return scoped(handle, *args, **kwargs)

    return wrapper


# --- AllGatherCoalescedHandle.wait: a bucket ------------------------------------------------------------------


def _bucket_partition(handle, param):
    return param.ds_secondary_tensor if handle.use_secondary_tensor else param.ds_tensor


def _stored_bucket_segments(handle):
    """Quantized buffers of a gathered bucket of MixZ++ partitions: each partition was quantized on its own (its own
    group layout), and the sequence repeats for every rank."""
    return tuple(_partition_numel(_bucket_partition(handle, param)) for param in handle.params) * handle.world_size


@contextlib.contextmanager
def _float_partition_views(params, dtypes):
    """During the wait, show int8 MixZ++ partitions as empty tensors of the parameter's dtype: from v0.17.2 each
    slice is cast to ``param.ds_tensor.dtype``, which for them is int8 and would truncate the values."""
    swapped = []
    for param, dtype in zip(params, dtypes):
        partition = param.ds_tensor
        if partition is not None and partition.dtype == torch.int8:
            view = torch.empty(0, dtype=dtype, device=partition.device)
            view.__dict__.update(partition.__dict__)
            param.ds_tensor = view
            swapped.append((param, partition))
    try:
        yield
    finally:
        for param, partition in swapped:
            param.ds_tensor = partition


def bucket_gather(original):
    """Why this seam: AllGatherCoalescedHandle.wait dequantizes a whole bucket, possibly of mixed dtypes, without a
    dtype on every release (slices stay fp16 before 0.17.2). Dequantizing in the bucket's common dtype (fp32 when
    mixed) and casting each slice once keeps every dtype and its precision.

    Seam factory for ``AllGatherCoalescedHandle.wait``. A bucket whose fetch sent packets is completed by the
    fetch protocol (``fetch.complete_bucket``: each parameter's values written into its buffer, no per-rank
    split); other quantized buckets run the original under the common dequantize target of dtype_scoped. Each rank
    quantized the concatenation of its partitions of the bucket, one block per rank; a bucket of stored MixZ++ codes
    instead has one block per partition and rank, and float views of those partitions."""

    def wrapper(handle, *args, **kwargs):
        if not getattr(handle, "quantization", None) or getattr(handle, "complete", False):
            return original(handle, *args, **kwargs)
        params = list(handle.params)
        dtypes = [own_dtype(p) for p in params]
        if type(getattr(handle, "allgather_handle", None)) is PacketGather:
            return fetch.complete_bucket(handle, dtypes)
        if stored_quantized(_bucket_partition(handle, params[0])):
            layout = {"segments": _stored_bucket_segments(handle)}
        else:
            layout = {"blocks": handle.world_size}
        with dequant_target(bucket_dtype(dtypes), **layout), _float_partition_views(params, dtypes):
            result = original(handle, *args, **kwargs)
        restore_dtypes(params, dtypes)
        return result

    return wrapper


# --- NoGather handles and Init's synchronous gathers ----------------------------------------------------------


def _any_stored_quantized(params):
    return any(stored_quantized(p.ds_tensor) for p in params)


no_gather = dtype_scoped(lambda handle, param, *a, **k: [param],
                         lambda handle, param, *a, **k: stored_quantized(param.ds_tensor),
                         why=("Why this seam: NoGatherHandle.__init__ dequantizes a stored int8 (MixZ++) partition "
                              "when the partition group has one rank; before 0.19.6 it hands back fp16."))
no_gather_coalesced = dtype_scoped(lambda handle, params, *a, **k: list(params),
                                   lambda handle, params, *a, **k: _any_stored_quantized(params),
                                   why="Why this seam: NoGatherCoalescedHandle.__init__, as NoGatherHandle.__init__, "
                                   "for a list of parameters.")


def _init_layout(init, params, *args, **kwargs):
    """Init's gathers dequantize each parameter's whole gathered buffer: one stored partition per rank of the
    parameters' partition group (DeepSpeed groups the list by that group before calling)."""
    return {"blocks": torch.distributed.get_world_size(group=init.get_partition_dp_group(params[0]))}


def _init_coalesced_quantized(init, params, hierarchy=0, quantize=False):
    return bool(quantize) and len(params) > 0


# Process-group backends whose collectives on one group complete in launch order (one stream per communicator);
# others join with register_in_order_backend.
IN_ORDER_BACKENDS = {"nccl"}


def register_in_order_backend(name):
    """Declare that the process-group backend ``name`` completes each group's collectives in launch order, as NCCL
    does (the simulated world, which queues each group's collectives on one stream, registers its own): Init's
    coalesced gathers of a quantized list then stay one call."""
    IN_ORDER_BACKENDS.add(name)


def _completes_in_order(init, params):
    """Whether waiting on a list's last all-gather covers the list's earlier ones: every parameter in one partition
    group of an in-order backend (NCCL: one communicator stream; DeepSpeed then also synchronizes the device when
    the call ends). Gloo completes each all-gather on its own, also for CUDA tensors."""
    group = init.get_partition_dp_group(params[0])
    if any(init.get_partition_dp_group(p) is not group for p in params):
        return False
    try:
        return torch.distributed.get_backend(group) in IN_ORDER_BACKENDS
    except (RuntimeError, ValueError):  # a group torch does not know: split, as for gloo
        return False


def init_gather_coalesced(original):
    """Why this seam: Init's own coalesced all-gather (GatheredParameters with hierarchy) dequantizes each parameter
    without a dtype before 0.19.6, and up to 0.19.5 reads every buffer of its list after waiting on the last all-
    gather only; the wrapper knows the list of parameters it fills.

    Seam factory for ``Init._allgather_params_coalesced``, told by its caller whether the list is quantized:
    the common dequantize target of dtype_scoped. When the Init quantizes weights (qwZ or MixZ++), a list is
    gathered one parameter per call: up to 0.19.5 the method waits on its last parameter's all-gather only
    before reading every buffer, and gloo completes the others in any order, so their values or codes may still be
    arriving (garbage, which GatheredParameters(modifier_rank=...), as in save_16bit_model, writes back into the
    partitions). With one parameter, its one all-gather is the one waited on. Lists whose all-gathers complete in
    launch order (NCCL, one group) stay one call: each call ends in a device synchronization, so splitting the
    persistent parameters' gather after every step cost each ZeRO-3 step one host stall per parameter.
    A list of unquantized partitions (those persistent parameters after every step) is gathered in one all-gather
    per partition group and dtype instead of one per parameter (``coalesced.py``: the same values, one collective's
    latency a step instead of hundreds). Without a ZeRO++ flag the original runs untouched, as stock."""
    gather = dtype_scoped(lambda init, params, *a, **k: params, _init_coalesced_quantized, _init_layout)(original)

    def wrapper(init, params, *args, **kwargs):
        if len(params) < 2 or not weights_quantized(init):
            return gather(init, params, *args, **kwargs)
        if not _init_coalesced_quantized(init, params, *args, **kwargs):
            if coalesced.applies(init, params):
                return coalesced.gather(init, params)
            return gather(init, params, *args, **kwargs)
        if _completes_in_order(init, params):
            return gather(init, params, *args, **kwargs)
        for param in params:
            gather(init, [param], *args, **kwargs)
        return None

    return wrapper


# Init's sequential gather dequantizes exactly the parameters whose partitions are stored as MixZ++ codes.
init_gather_sequential = dtype_scoped(lambda init, params, *a, **k: params,
                                      lambda init, params, *a, **k: _any_stored_quantized(params),
                                      _init_layout,
                                      why="Why this seam: Init's sequential all-gather (the 0.18.5+ name of "
                                      "_allgather_params).")


def init_gather_single(original):
    """Why this seam: Init's sequential all-gather dequantizes without a dtype, and its quantized branch never fires
    (it looks for ds_quant_scale on the parameter, not its partition); renamed in 0.18.5.

    ``Init._allgather_params`` (<= 0.18.4): its quantized branch tests the parameter instead of its partition
    for ``ds_quant_scale``, so MixZ++ codes come back undequantized. Quantized lists go to Init's coalesced
    gather, which handles them; everything else runs the original (which then dequantizes nothing)."""

    def wrapper(init, param_list, *args, **kwargs):
        if _any_stored_quantized(param_list):
            hierarchy = kwargs.get("hierarchy", args[0] if args else 0)
            return init._allgather_params_coalesced(param_list, hierarchy, quantize=True)
        return original(init, param_list, *args, **kwargs)

    return wrapper
