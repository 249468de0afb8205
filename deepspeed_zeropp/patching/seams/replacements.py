"""Seams at DeepSpeed's quantizer (``CUDAQuantizer``'s methods, ``Init.quantizer_module``) and its quantized
gradient collectives (qgZ, LoCo): sites whose whole job deepspeed_zeropp does itself.

``quantize`` and the two reduce-scatters are where a rank's quantized data is made for the wire (a weight
all-gather quantizes before it sends; qgZ encodes inside the collective), so they first make sure that every rank
runs the same wire format (``agreement.ensure``: once per process, and only with a ZeRO++ flag, since DeepSpeed
calls them for nothing else)."""
from ... import agreement, loco, qgz
from ..quantizer import QuantizerMethods
from .common import replace_with


def agreed_first(impl):
    """Seam factory for our entry points that put quantized data on the wire: ``impl`` runs once every rank agrees
    (``agreement.ensure``, looked up at each call: a module attribute the tests can spy on)."""

    def factory(original):

        def method(*args, **kwargs):
            agreement.ensure()
            return impl(*args, **kwargs)

        return method

    return factory


QUANTIZER_INIT = replace_with(QuantizerMethods.__init__)
QUANTIZE = agreed_first(QuantizerMethods.quantize)
DEQUANTIZE = replace_with(QuantizerMethods.dequantize)
QUANT_REDUCE = agreed_first(qgz.all_to_all_quant_reduce)
LOCO_QUANT_REDUCE = agreed_first(loco.all_to_all_loco_quant_reduce)


def class_quantizer(original):
    """``Init.quantizer_module`` as a class attribute: the NoGather handles read it from the class, where
    upstream never sets it (only instances get one, and only when their own config asks for quantization)."""
    from deepspeed.runtime.zero.partition_parameters import CUDAQuantizer
    return CUDAQuantizer()
