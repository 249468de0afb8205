"""The methods installed on DeepSpeed's ``CUDAQuantizer`` class: its interface, our numerics.

``CUDAQuantizer`` is the one object every quantize/dequantize site reaches (``Init.quantizer_module``,
``QuantizationInfo.backend``, ``stage3``'s alias through its star import), so replacing its methods on the
class covers every instance, existing or future. The signatures match upstream 0.19.6+:
``quantize(param, groups=None)`` and ``dequantize(quantized_param, scale, dtype=None)``.
"""
from .. import backends, ops
from .scope import DEFERRED, current_target, quantize_is_deferred


class QuantizerMethods:
    """Holder for the replacement methods; they quantize with ``backends.default()``, which
    ``deepspeed_zeropp.patch`` sets."""

    def __init__(self):
        """Nothing to set up: only ``backend="deepspeed"`` needs DeepSpeed's op, and loads it on first use."""

    def quantize(self, param, groups=None):
        """Quantize ``param`` in its own dtype, in a bounded group layout for any size. Returns int8 codes and 1-D fp32 scales
        (gloo-compatible), both views of one packet (formats/int8.py), so that a fetch can all-gather them at once
        (patching/seams/gathers.py)."""
        if quantize_is_deferred():
            return param.zero_(), DEFERRED
        return ops.quantize_packed(param, groups, backend=backends.default())

    def quantize_many(self, params):
        """``quantize`` of each of ``params`` (default groups), the same packets, made together (``ops``'s batch:
        one kernel for many on the CUDA backend); None while quantization is deferred."""
        if quantize_is_deferred():
            return None
        return ops.quantize_packed_many(params, backend=backends.default())

    def dequantize(self, quantized_param, scale, dtype=None):
        """Dequantize to ``dtype``, else to the dtype the enclosing patched gather site recorded from its
        parameters, else fp16. The site also says how the gathered codes are laid out (one quantized block per
        rank): a ``GatheredLayout``, handed to ops unchanged, or segments."""
        target = current_target()
        if target is None:
            return ops.dequantize(quantized_param, scale, dtype, backend=backends.default())
        dtype = dtype or target.dtype
        if target.segments:
            return ops.dequantize_segments(quantized_param, scale, target.segments, dtype, backend=backends.default())
        layout = target.layout_of(quantized_param)
        if layout is None:
            return ops.dequantize(quantized_param, scale, dtype, backend=backends.default())
        return ops.dequantize_gathered(quantized_param, scale, layout, dtype, backend=backends.default())

    @staticmethod
    def quantize_partition(partition, like=None):
        """Int8 codes of a float ZeRO partition, to replace ``like`` (default: the partition itself)."""
        codes, scales = ops.quantize(partition, backend=backends.default())
        return QuantizerMethods.stored_partition(codes, scales, partition if like is None else like)

    @staticmethod
    def stored_partition(codes, scales, like):
        """``codes`` made a MixZ++ partition in place of ``like``: its attributes, and ``scales`` as
        ``ds_quant_scale``."""
        codes.__dict__.update({k: v for k, v in like.__dict__.items() if k != "ds_quant_scale"})
        codes.ds_quant_scale = scales
        return codes

    @staticmethod
    def dequantize_partition(partition, dtype):
        """A MixZ++ partition's values in ``dtype``: what a forward gathers from it."""
        return ops.dequantize(partition, partition.ds_quant_scale, dtype, backend=backends.default())
