"""Seams at DeepSpeed's quantizer (``CUDAQuantizer``'s methods, ``Init.quantizer_module``) and its quantized
gradient collectives (qgZ, LoCo): sites whose whole job deepspeed_zeropp does itself.

``quantize`` and the two reduce-scatters are where a rank's quantized data is made for the wire (a weight
all-gather quantizes before it sends; qgZ encodes inside the collective), so they first make sure that every rank
runs the same wire format (``agreement.ensure``: once per process, and only with a ZeRO++ flag, since DeepSpeed
calls them for nothing else)."""
import functools

from ... import agreement, loco, qgz
from ..quantizer import QuantizerMethods
from . import buckets, fetch
from .common import replace_with

# qgZ and LoCo as the seams call them: each reports its last read of a bucket's gradients (seams/buckets.py)
_quant_reduce = functools.partial(qgz.all_to_all_quant_reduce, on_read=buckets.gradients_read)
_loco_quant_reduce = functools.partial(loco.all_to_all_loco_quant_reduce, on_read=buckets.gradients_read)


def agreed_first(impl, why):
    """Seam factory for our entry points that put quantized data on the wire: ``impl`` runs once every rank agrees
    (``agreement.ensure``, looked up at each call: a module attribute the tests can spy on); ``why``: the factory's
    docstring."""

    def factory(original):

        def method(*args, **kwargs):
            agreement.ensure(fetch.sends_packets)
            return impl(*args, **kwargs)

        return method

    factory.__doc__ = why
    return factory


quantizer_init = replace_with(QuantizerMethods.__init__,
                              why="Why this seam: upstream's constructor loads the fp16-only CUDA op, which does not "
                              "exist on CPU and is not needed by our backends; only "
                              "``backend=\"deepspeed\"`` loads it (lazily, on first use).")
quantizer_quantize = agreed_first(fetch.quantize_once(QuantizerMethods.quantize, QuantizerMethods.quantize_many),
                                  why="Why this seam: upstream reads every input as fp16 bits; ours quantizes each "
                                  "dtype natively and picks a bounded group layout for any size "
                                  "(formats/grouping.py), once per partition and step, those of a forward at once "
                                  "(seams/fetch.py).")
quantizer_dequantize = replace_with(QuantizerMethods.dequantize,
                                    why="Why this seam: upstream always returns fp16. An explicit ``dtype`` wins; "
                                    "otherwise the dtype the enclosing patched gather site recorded from its "
                                    "parameters; otherwise fp16, as upstream.")
quant_reduce = agreed_first(_quant_reduce,
                            why="Why this seam: qgZ's all_to_all_quant_reduce reads bf16/fp32 gradients as fp16 bits,"
                            " sums partials in fp16 and casts back; the whole function is that kernel pipeline, "
                            "so it is reimplemented (same signature, same 4-bit two-stage all-to-all) with native"
                            " dtypes and fp32 sums.")
stage3_quant_reduce = agreed_first(_quant_reduce,
                                   why="Why this seam: stage3 binds all_to_all_quant_reduce by name at import; this "
                                   "is the binding it calls.")
loco_quant_reduce = agreed_first(_loco_quant_reduce,
                                 why="Why this seam: LoCo's all_to_all_loco_quant_reduce (qgZ with error feedback, "
                                 "zeropp_loco_param) reads bf16/fp32 gradients and its error buffers as fp16 "
                                 "bits; the whole function is that kernel pipeline, so it is reimplemented (same "
                                 "signature and error-buffer attributes) on our qgZ with fp32 error feedback.")
stage3_loco_quant_reduce = agreed_first(_loco_quant_reduce,
                                        why="Why this seam: stage3 binds all_to_all_loco_quant_reduce by name at "
                                        "import; this is the binding it calls.")


def class_quantizer(original):
    """Why this seam: the NoGather handles read Init.quantizer_module from the class, which upstream never assigns
    (AttributeError with MixZ++ at partition world size 1, or after zero.Init() without a config).

    ``Init.quantizer_module`` as a class attribute: the NoGather handles read it from the class, where
    upstream never sets it (only instances get one, and only when their own config asks for quantization)."""
    from deepspeed.runtime.zero.partition_parameters import CUDAQuantizer
    return CUDAQuantizer()
