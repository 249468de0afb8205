"""Wrappers installed at DeepSpeed's sites. Each site's row in sites.py says why that seam.

Gather sites share one mechanism: record each parameter's own dtype before the original method runs, publish a
dequantize target for the call (the common dtype, or fp32 for a bucket mixing dtypes, so every value is rounded
only once, and the layout of the gathered codes: one quantized block per rank), and afterwards hand each
parameter back in its own dtype. The original method body always runs, so other upstream fixes of the installed
release are kept.
"""
import contextlib

import torch

from ..dtypes import SUPPORTED_DTYPES
from ..quantizer import QuantizerMethods
from ..scope import DEFERRED, deferring_quantize, dequant_target

MARKER = "__deepspeed_zeropp__"


def own_dtype(param):
    """The dtype a ZeRO-3 parameter must be handed back in.

    Recorded when MixZ++ stored its partition as int8; else the partition's (``ds_tensor``) dtype; else the
    placeholder ``param.data``'s (unpatched releases leave that fp16 after one gather, hence last)."""
    recorded = getattr(param, "ds_zeropp_dtype", None)
    if recorded is not None:
        return recorded
    partition = getattr(param, "ds_tensor", None)
    if partition is not None and partition.dtype in SUPPORTED_DTYPES:
        return partition.dtype
    return param.dtype


def _bucket_dtype(dtypes):
    unique = set(dtypes)
    return unique.pop() if len(unique) == 1 else torch.float32


def _restore_dtypes(params, dtypes):
    for param, dtype in zip(params, dtypes):
        if param.data.dtype != dtype:
            param.data = param.data.to(dtype)


def stored_quantized(partition):
    """True for a MixZ++ partition kept as int8 codes (with its ``ds_quant_scale``)."""
    return partition is not None and hasattr(partition, "ds_quant_scale")


def mark(wrapper, original, why):
    """Tag ``wrapper`` as ours: marker attribute, ``__wrapped__``, the original's name, and a docstring that
    says why this seam."""
    setattr(wrapper, MARKER, True)
    wrapper.__wrapped__ = original
    wrapper.__doc__ = why
    for attr in ("__name__", "__qualname__", "__module__"):
        if hasattr(original, attr):
            setattr(wrapper, attr, getattr(original, attr))
    return wrapper


def replace_with(impl):
    """Seam factory for methods whose whole job we do ourselves (the quantizer's methods)."""

    def factory(original):

        def method(*args, **kwargs):
            return impl(*args, **kwargs)

        return method

    return factory


def dtype_scoped(params_of, quantized, layout_of=lambda *a, **k: {}):
    """Seam factory for gather sites: run the original under a dequantize target built from its parameters.

    ``params_of(*args, **kwargs)`` names the parameters the call hands back; ``quantized`` says whether the
    call dequantizes at all (otherwise it runs untouched); ``layout_of`` gives the gathered codes' layout as
    ``dequant_target`` keywords (``block_numel`` or ``blocks``)."""

    def factory(original):

        def wrapper(*args, **kwargs):
            if not quantized(*args, **kwargs):
                return original(*args, **kwargs)
            params = list(params_of(*args, **kwargs))
            dtypes = [own_dtype(p) for p in params]
            with dequant_target(_bucket_dtype(dtypes), **layout_of(*args, **kwargs)):
                result = original(*args, **kwargs)
            _restore_dtypes(params, dtypes)
            return result

        return wrapper

    return factory


# --- AllGatherHandle.wait: one parameter ----------------------------------------------------------------------


def _single_quantization(handle, *args, **kwargs):
    if getattr(handle, "_AllGatherHandle__complete", False):
        return None
    return getattr(handle, "_AllGatherHandle__quantization", None)


def _partition_numel(partition):
    return getattr(partition, "ds_numel", partition.numel())


def _single_layout(handle, *args, **kwargs):
    """The sequential path narrows the gathered buffer to ``ds_numel``, so the per-rank blocks cannot be read off
    the codes (upstream divides by the scale count: scales land on the wrong elements when the partition is
    padded). Each rank quantized the partition it all-gathered: the hpZ secondary one where the parameter has it,
    as upstream picks it."""
    param = handle._AllGatherHandle__param
    secondary = getattr(param, "ds_secondary_tensor", None)
    return {"block_numel": _partition_numel(secondary if secondary is not None else param.ds_tensor)}


SINGLE_GATHER = dtype_scoped(lambda handle, *a, **k: [handle._AllGatherHandle__param],
                             lambda handle, *a, **k: _single_quantization(handle) is not None, _single_layout)

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


def BUCKET_GATHER(original):
    """Seam factory for ``AllGatherCoalescedHandle.wait``: the common dequantize target of dtype_scoped. Each rank
    quantized the concatenation of its partitions of the bucket, one block per rank; a bucket of stored MixZ++ codes
    instead has one block per partition and rank, and float views of those partitions."""

    def wrapper(handle, *args, **kwargs):
        if not getattr(handle, "quantization", None) or getattr(handle, "complete", False):
            return original(handle, *args, **kwargs)
        params = list(handle.params)
        dtypes = [own_dtype(p) for p in params]
        stored = stored_quantized(_bucket_partition(handle, params[0]))
        layout = {"segments": _stored_bucket_segments(handle)} if stored else {"blocks": handle.world_size}
        with dequant_target(_bucket_dtype(dtypes), **layout), _float_partition_views(params, dtypes):
            result = original(handle, *args, **kwargs)
        _restore_dtypes(params, dtypes)
        return result

    return wrapper


# --- NoGather handles and Init's synchronous gathers ----------------------------------------------------------


def _any_stored_quantized(params):
    return any(stored_quantized(p.ds_tensor) for p in params)


NO_GATHER = dtype_scoped(lambda handle, param, *a, **k: [param],
                         lambda handle, param, *a, **k: stored_quantized(param.ds_tensor))
NO_GATHER_COALESCED = dtype_scoped(lambda handle, params, *a, **k: list(params),
                                   lambda handle, params, *a, **k: _any_stored_quantized(params))


def _init_layout(init, params, *args, **kwargs):
    """Init's gathers dequantize each parameter's whole gathered buffer: one stored partition per rank of the
    parameters' partition group (DeepSpeed groups the list by that group before calling)."""
    return {"blocks": torch.distributed.get_world_size(group=init.get_partition_dp_group(params[0]))}


def _init_coalesced_quantized(init, params, hierarchy=0, quantize=False):
    return bool(quantize) and len(params) > 0


def INIT_GATHER_COALESCED(original):
    """Seam factory for ``Init._allgather_params_coalesced``, told by its caller whether the list is quantized:
    the common dequantize target of dtype_scoped. When the Init quantizes weights (qwZ or MixZ++), a list is
    gathered one parameter per call: up to 0.19.5 the method waits on its last parameter's all-gather only
    before reading every buffer, and gloo completes the others in any order, so their values or codes may still be
    arriving (garbage, which GatheredParameters(modifier_rank=...), as in save_16bit_model, writes back into the
    partitions). With one parameter, its one all-gather is the one waited on. Without a ZeRO++ flag the original
    runs untouched, as stock."""
    gather = dtype_scoped(lambda init, params, *a, **k: params, _init_coalesced_quantized, _init_layout)(original)

    def wrapper(init, params, *args, **kwargs):
        if len(params) < 2 or not weights_quantized(init):
            return gather(init, params, *args, **kwargs)
        for param in params:
            gather(init, [param], *args, **kwargs)
        return None

    return wrapper


# Init's sequential gather dequantizes exactly the parameters whose partitions are stored as MixZ++ codes.
INIT_GATHER_SEQUENTIAL = dtype_scoped(lambda init, params, *a, **k: params,
                                      lambda init, params, *a, **k: _any_stored_quantized(params), _init_layout)


def INIT_GATHER_SINGLE(original):
    """``Init._allgather_params`` (<= 0.18.4): its quantized branch tests the parameter instead of its partition
    for ``ds_quant_scale``, so MixZ++ codes come back undequantized. Quantized lists go to Init's coalesced
    gather, which handles them; everything else runs the original (which then dequantizes nothing)."""

    def wrapper(init, param_list, *args, **kwargs):
        if _any_stored_quantized(param_list):
            hierarchy = kwargs.get("hierarchy", args[0] if args else 0)
            return init._allgather_params_coalesced(param_list, hierarchy, quantize=True)
        return original(init, param_list, *args, **kwargs)

    return wrapper


# --- MixZ++ partitioning ----------------------------------------------------------------------------------------


def _partition_rank(init, param, attr):
    if attr == "ds_secondary_tensor":
        return init.rank_in_group
    return torch.distributed.get_rank(group=init.get_partition_dp_group(param))


def weights_quantized(init):
    """Whether an ``Init`` quantizes weights (qwZ or MixZ++), from its arguments or its config. Without either,
    its partitioning is left to DeepSpeed untouched."""
    return bool(getattr(init, "quantized_weights", False) or getattr(init, "quantized_nontrainable_weights", False))


def _zero_padding(param, attr, rank):
    """The last rank's partition is padded to the common size; upstream leaves the padding of the primary
    partition uninitialised. qwZ quantizes whole partitions, so stale padding can set a group's absmax (even to
    inf or NaN) and wipe out the real values sharing that group. Only a partition holding its full padded size
    is touched: one released to NVMe is a one-element stand-in until it is swapped back in."""
    partition = getattr(param, attr, None)
    if partition is None or partition.dtype not in SUPPORTED_DTYPES:
        return
    size = getattr(partition, "ds_numel", None)
    if not isinstance(size, int) or size < 1 or partition.numel() != size:
        return
    valid = min(max(param.ds_numel - rank * size, 0), size)
    if valid < size:
        with torch.no_grad():
            partition.view(-1).narrow(0, valid, size - valid).zero_()


@contextlib.contextmanager
def _float_stand_in(param, attr, rewritten):
    """While DeepSpeed rewrites an existing MixZ++ partition (re-partitioning with ``has_been_updated`` after
    GatheredParameters(modifier_rank=...)), it copies float values into the int8 codes, truncating them to 0
    or +-1. Handed a float partition of the parameter's dtype holding the current values instead, it writes
    there, and what it wrote is quantized afterwards. An unchanged partition keeps its codes: quantizing
    dequantized values again would move them (a group's absmax is not always a code of 127)."""
    codes = getattr(param, attr, None)
    if not rewritten or not stored_quantized(codes):
        yield
        return
    dtype = own_dtype(param)
    stand_in = QuantizerMethods.dequantize_partition(codes, dtype)
    stand_in.__dict__.update({k: v for k, v in codes.__dict__.items() if k != "ds_quant_scale"})
    setattr(param, attr, stand_in)
    try:
        yield
    finally:
        written = getattr(param, attr)
        unchanged = torch.equal(written, QuantizerMethods.dequantize_partition(codes, dtype))
        setattr(param, attr, codes if unchanged else QuantizerMethods.quantize_partition(written))


def _has_been_updated(args, kwargs):
    """``has_been_updated`` of ``_partition_param(param, buffer=None, has_been_updated=False, ...)``."""
    return kwargs.get("has_been_updated", len(args) > 1 and args[1])


def partition_seam(attr):
    """Seam factory for ``Init._partition_param`` (attr ``ds_tensor``) and ``_partition_param_sec``
    (``ds_secondary_tensor``). MixZ++: upstream quantizes the freshly allocated, still empty buffer and then copies
    the float values into the int8 result, so quantization is deferred until the partition holds its values; a
    partition rewritten from updated data is re-quantized from the written values. And padding is zeroed, so
    that it never takes part in a quantization group's absmax."""

    def factory(original):

        def wrapper(init, param, *args, **kwargs):
            if not weights_quantized(init):
                return original(init, param, *args, **kwargs)
            fresh = (getattr(param, attr, None) is None and not param.requires_grad
                     and getattr(init, "quantized_nontrainable_weights", False))
            if not fresh:
                with _float_stand_in(param, attr, _has_been_updated(args, kwargs)):
                    result = original(init, param, *args, **kwargs)
                    _zero_padding(param, attr, _partition_rank(init, param, attr))
                return result
            dtype = param.dtype
            with deferring_quantize():
                result = original(init, param, *args, **kwargs)
            partition = getattr(param, attr, None)
            if partition is not None and getattr(partition, "ds_quant_scale", None) is DEFERRED:
                setattr(param, attr, QuantizerMethods.quantize_partition(partition))
                param.ds_zeropp_dtype = dtype
            return result

        return wrapper

    return factory


def engine_padding(original):
    """Seam factory for ``DeepSpeedZeRoOffload._convert_to_zero_parameters``: a model built under a bare
    ``zero.Init()`` was partitioned by an Init without quantization flags (so the partition seams left it alone),
    yet the engine's config may turn qwZ or MixZ++ on for its gathers. Once the engine knows, the padding of every
    partition is zeroed, as the partition seams do when Init knows."""

    def wrapper(offload, ds_config, module, *args, **kwargs):
        result = original(offload, ds_config, module, *args, **kwargs)
        if (getattr(offload, "zero_quantized_weights", False)
                or getattr(offload, "zero_quantized_nontrainable_weights", False)):
            for param in module.parameters():
                if getattr(param, "ds_tensor", None) is not None:
                    _zero_padding(param, "ds_tensor", torch.distributed.get_rank(group=param.ds_process_group))
        return result

    return wrapper


def nontrainable_seam(original):
    """Seam factory for ``quantize_nontrainable_params``: with MixZ++ off, upstream's own method runs (it only
    warns and returns); with it on, our dtype-keeping reimplementation."""

    def wrapper(optimizer, *args, **kwargs):
        if not getattr(optimizer, "zero_quantized_nontrainable_weights", False):
            return original(optimizer, *args, **kwargs)
        return quantize_nontrainable_params(optimizer, *args, **kwargs)

    return wrapper


def quantize_nontrainable_params(optimizer):
    """Quantize the partitions of parameters frozen after ZeRO-3 partitioning (LoRA), in their own dtype.
    Same selection as upstream: frozen, not yet quantized, and not small (partition > 2048 and numel > 500000)."""
    for param in optimizer.module.parameters():
        partition = getattr(param, "ds_tensor", None)
        if partition is None or param.requires_grad or partition.numel() <= 2048 or param.ds_numel <= 500000:
            continue
        dtype = own_dtype(param)
        for attr in ("ds_tensor", "ds_secondary_tensor"):
            partition = getattr(param, attr, None)
            if partition is not None and not stored_quantized(partition):
                setattr(param, attr, QuantizerMethods.quantize_partition(partition))
        param.ds_zeropp_dtype = dtype


# --- checkpoints of MixZ++ weights ----------------------------------------------------------------------------


def frozen_fragment(original):
    """Seam factory for ``DeepSpeedEngine._get_param_fragment_func``: a MixZ++ weight's fragment in the model
    states file is its dequantized partition in its own dtype, what zero_to_fp32 and a forward read. Its codes
    and scales ride along as attributes (``ds_zeropp_codes``, ``ds_zeropp_scale``; pickled with the tensor,
    dropped by zero_to_fp32's concatenation) so that loading restores them exactly."""

    def wrapper(engine, param):
        fragment = original(engine, param)
        partition = getattr(param, "ds_tensor", None)
        if not stored_quantized(partition):
            return fragment
        values = QuantizerMethods.dequantize_partition(partition, own_dtype(param)).detach().cpu()
        values.ds_zeropp_codes = fragment
        values.ds_zeropp_scale = partition.ds_quant_scale.detach().cpu()
        return values

    return wrapper


def _restored_partition(partition, saved):
    """The MixZ++ partition for a saved frozen fragment: its own codes when it carries them, else (a checkpoint
    written without MixZ++) the saved values quantized."""
    codes = getattr(saved, "ds_zeropp_codes", None)
    if codes is None:
        return QuantizerMethods.quantize_partition(saved.to(partition.device), like=partition)
    scales = saved.ds_zeropp_scale.to(partition.device, copy=True)
    return QuantizerMethods.stored_partition(codes.to(partition.device, copy=True), scales, partition)


def load_frozen_fragments(original):
    """Seam factory for ``DeepSpeedEngine.load_module_state_dict``: upstream copies each saved frozen fragment
    into ``param.ds_tensor``, which for a MixZ++ weight is int8 (floats truncated to 0 or +-1). Afterwards every
    MixZ++ partition whose float fragment was loaded is rebuilt from the checkpoint."""

    def wrapper(engine, checkpoint, *args, **kwargs):
        result = original(engine, checkpoint, *args, **kwargs)
        from deepspeed.checkpoint.constants import FROZEN_PARAM_FRAGMENTS
        fragments = checkpoint.get(FROZEN_PARAM_FRAGMENTS) or {}
        for param in engine.module.parameters():
            partition = getattr(param, "ds_tensor", None)
            saved = fragments.get(engine.param_names.get(param))
            if stored_quantized(partition) and saved is not None and saved.dtype in SUPPORTED_DTYPES:
                param.ds_tensor = _restored_partition(partition, saved)
        return result

    return wrapper


def class_quantizer(original):
    """``Init.quantizer_module`` as a class attribute: the NoGather handles read it from the class, where
    upstream never sets it (only instances get one, and only when their own config asks for quantization)."""
    from deepspeed.runtime.zero.partition_parameters import CUDAQuantizer
    return CUDAQuantizer()
