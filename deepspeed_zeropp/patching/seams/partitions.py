"""Seams where DeepSpeed partitions parameters: MixZ++ partitions stored as int8 codes (quantized once they hold
their values, re-quantized when rewritten, frozen after partitioning), and the zeroed padding of the last rank's
partition that qwZ quantizes with the real values."""
import contextlib

import torch

from ... import agreement
from ...formats.dtypes import SUPPORTED_DTYPES
from ..quantizer import QuantizerMethods
from ..scope import DEFERRED, deferring_quantize
from . import fetch, secondary
from .common import own_dtype, stored_quantized, weights_quantized


def _partition_rank(init, param, attr):
    if attr == "ds_secondary_tensor":
        return init.rank_in_group
    return torch.distributed.get_rank(group=init.get_partition_dp_group(param))


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


def partition_seam(attr, why):
    """Seam factory for ``Init._partition_param`` (attr ``ds_tensor``) and ``_partition_param_sec``
    (``ds_secondary_tensor``). MixZ++: upstream quantizes the freshly allocated, still empty buffer and then copies
    the float values into the int8 result, so quantization is deferred until the partition holds its values; a
    partition rewritten from updated data is re-quantized from the written values. And padding is zeroed, so
    that it never takes part in a quantization group's absmax. The secondary partition is written without
    DeepSpeed's host wait (``secondary.py``). A rewrite drops the packets kept within the step, and a release
    marks the partition's packet as wanted again (``fetch.forward_pass``). ``why``: the factory's docstring."""
    writing = secondary.without_host_wait if attr == "ds_secondary_tensor" else contextlib.nullcontext

    def factory(original):

        def wrapper(init, param, *args, **kwargs):
            # A partition that exists and is not being rewritten is left as it is (ZeRO-3 only frees the gathered
            # weights): nothing to defer, stand in for or zero. This is the call of every release after a fetch.
            updated = kwargs.get("has_been_updated", len(args) > 1 and args[1])  # checked first: the common call
            if updated:
                fetch.forget_packets()  # a kept packet of the old values would be sent again (fetch.forward_pass)
            if not updated and getattr(param, attr, None) is not None:
                if attr == "ds_tensor":
                    fetch.partition_released(param.ds_tensor)  # its kept packet is wanted again (fetch.py)
                return original(init, param, *args, **kwargs)
            if not weights_quantized(init):
                return original(init, param, *args, **kwargs)
            if attr == "ds_secondary_tensor" and secondary.unwritten_in_step():
                return None  # nothing reads it: the step drops every secondary partition (secondary.optimizer_step)
            fresh = (getattr(param, attr, None) is None and not param.requires_grad
                     and getattr(init, "quantized_nontrainable_weights", False))
            if not fresh:
                with _float_stand_in(param, attr, updated), writing():
                    result = original(init, param, *args, **kwargs)
                    _zero_padding(param, attr, _partition_rank(init, param, attr))
                return result
            dtype = param.dtype
            with deferring_quantize(), writing():
                result = original(init, param, *args, **kwargs)
            partition = getattr(param, attr, None)
            if partition is not None and getattr(partition, "ds_quant_scale", None) is DEFERRED:
                setattr(param, attr, QuantizerMethods.quantize_partition(partition))
                param.ds_zeropp_dtype = dtype
            return result

        return wrapper

    factory.__doc__ = why
    return factory


partition_param = partition_seam("ds_tensor",
                                 why="Why this seam: with MixZ++, _partition_param quantizes the freshly allocated "
                                 "(empty) partition and then copies the float values into the int8 result: frozen"
                                 " weights become garbage. Quantization is deferred until the partition holds its"
                                 " values. It also leaves the last rank's padding uninitialised, which qwZ then "
                                 "quantizes along with real values: the padding is zeroed.")
partition_param_sec = partition_seam("ds_secondary_tensor",
                                     why="Why this seam: the hpZ secondary partition has the same "
                                     "quantize-before-copy defect as _partition_param (and, before 0.19.8, the "
                                     "same uninitialised padding); and DeepSpeed blocks the host once per "
                                     "parameter after writing it, which the device can order instead.")


def engine_padding(original):
    """Why this seam: a model built under zero.Init() without a config was partitioned by an Init that knew of no
    quantization, leaving the last rank's padding uninitialised; the engine's config may still turn qwZ on for
    every gather. This is the first engine step that knows the flags and sees every partition.

    Seam factory for ``DeepSpeedZeRoOffload._convert_to_zero_parameters``: a model built under a bare
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
    """Why this seam: upstream asserts that frozen partitions are fp16 before quantizing them, so MixZ++ after
    freezing (LoRA) is impossible in bf16/fp32; the whole body is that assert plus the quantization, so it is
    reimplemented on our quantizer (with MixZ++ off, upstream's method runs).

    Seam factory for ``quantize_nontrainable_params``: with MixZ++ off, upstream's own method runs (it only
    warns and returns); with it on, our dtype-keeping reimplementation."""

    def wrapper(optimizer, *args, **kwargs):
        if not getattr(optimizer, "zero_quantized_nontrainable_weights", False):
            return original(optimizer, *args, **kwargs)
        agreement.ensure(
            fetch.sends_packets)  # the codes made here are gathered next; no quantize call may have come before
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
