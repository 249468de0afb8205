"""The methods installed on DeepSpeed's ``CUDAQuantizer`` class: its interface, our numerics.

``CUDAQuantizer`` is the one object every quantize/dequantize site reaches (``Init.quantizer_module``,
``QuantizationInfo.backend``, ``stage3``'s alias through its star import), so replacing its methods on the
class covers every instance, existing or future. The signatures match upstream 0.19.6+:
``quantize(param, groups=None)`` and ``dequantize(quantized_param, scale, dtype=None)``.
"""
from . import ops
from .patching.scope import current_target


class QuantizerMethods:
    """Holder for the replacement methods; ``backend`` is set by ``deepspeed_zeropp.patch``."""

    backend = "auto"

    def __init__(self):
        """Why this seam: upstream's constructor loads the fp16-only CUDA op, which does not exist on CPU and
        is not needed by our backends; only ``backend="deepspeed"`` loads it (lazily, on first use)."""

    def quantize(self, param, groups=None):
        """Why this seam: upstream reads every input as fp16 bits; ours quantizes each dtype natively and
        picks a valid group count for any size. Returns int8 codes and 1-D fp32 scales (gloo-compatible)."""
        return ops.quantize(param, groups, backend=QuantizerMethods.backend)

    def dequantize(self, quantized_param, scale, dtype=None):
        """Why this seam: upstream always returns fp16. An explicit ``dtype`` wins; otherwise the dtype the
        enclosing patched gather site recorded from its parameters; otherwise fp16, as upstream."""
        target = current_target()
        group_size = None
        if target is not None:
            group_size = target.group_size
            dtype = dtype or target.dtype
        return ops.dequantize(quantized_param, scale, dtype, group_size=group_size, backend=QuantizerMethods.backend)
