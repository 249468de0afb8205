"""Seams at DeepSpeed's quantizer (``CUDAQuantizer``'s methods, ``Init.quantizer_module``) and its quantized
gradient collectives (qgZ, LoCo): sites whose whole job deepspeed_zeropp does itself."""
from ... import loco, qgz
from ...quantizer import QuantizerMethods
from .common import replace_with

QUANTIZER_INIT = replace_with(QuantizerMethods.__init__)
QUANTIZE = replace_with(QuantizerMethods.quantize)
DEQUANTIZE = replace_with(QuantizerMethods.dequantize)
QUANT_REDUCE = replace_with(qgz.all_to_all_quant_reduce)
LOCO_QUANT_REDUCE = replace_with(loco.all_to_all_loco_quant_reduce)


def class_quantizer(original):
    """``Init.quantizer_module`` as a class attribute: the NoGather handles read it from the class, where
    upstream never sets it (only instances get one, and only when their own config asks for quantization)."""
    from deepspeed.runtime.zero.partition_parameters import CUDAQuantizer
    return CUDAQuantizer()
