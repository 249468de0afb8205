"""What every seam shares: marking a wrapper as ours, the dtype a parameter is handed back in, and the
dtype-scoped gather mechanism.

Gather sites share one mechanism: record each parameter's own dtype before the original method runs, publish a
dequantize target for the call (the common dtype, or fp32 for a bucket mixing dtypes, so every value is rounded
only once, and the layout of the gathered codes: one quantized block per rank), and afterwards hand each
parameter back in its own dtype. The original method body always runs, so other upstream fixes of the installed
release are kept.
"""
import torch

from ...formats.dtypes import SUPPORTED_DTYPES
from ..scope import dequant_target

MARKER = "__deepspeed_zeropp__"


def accelerator():
    """DeepSpeed's accelerator, imported when a seam first needs it (seams load before DeepSpeed may)."""
    from deepspeed.accelerator import get_accelerator
    return get_accelerator()


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


def bucket_dtype(dtypes):
    unique = set(dtypes)
    return unique.pop() if len(unique) == 1 else torch.float32


def restore_dtypes(params, dtypes):
    for param, dtype in zip(params, dtypes):
        if param.dtype != dtype:  # the same as param.data's, without making a tensor per check
            param.data = param.data.to(dtype)


def stored_quantized(partition):
    """True for a MixZ++ partition kept as int8 codes (with its ``ds_quant_scale``)."""
    return partition is not None and hasattr(partition, "ds_quant_scale")


def mark(wrapper, original, why):
    """Tag ``wrapper`` as ours: marker attribute, ``__wrapped__``, the original's name, and its seam factory's
    docstring, which says why this seam."""
    setattr(wrapper, MARKER, True)
    wrapper.__wrapped__ = original
    wrapper.__doc__ = why
    for attr in ("__name__", "__qualname__", "__module__"):
        if hasattr(original, attr):
            setattr(wrapper, attr, getattr(original, attr))
    return wrapper


def replace_with(impl, why):
    """Seam factory for methods whose whole job we do ourselves (the quantizer's methods); ``why``: its docstring."""

    def factory(original):

        def method(*args, **kwargs):
            return impl(*args, **kwargs)

        return method

    factory.__doc__ = why
    return factory


def dtype_scoped(params_of, quantized, layout_of=lambda *a, **k: {}, *, why=None):
    """Seam factory for gather sites: run the original under a dequantize target built from its parameters.

    ``params_of(*args, **kwargs)`` names the parameters the call hands back; ``quantized`` says whether the
    call dequantizes at all (otherwise it runs untouched); ``layout_of`` gives the gathered codes' layout as
    ``dequant_target`` keywords (``layout``, a ``GatheredLayout``, or ``blocks``); ``why``: the factory's
    docstring."""

    def factory(original):

        def wrapper(*args, **kwargs):
            if not quantized(*args, **kwargs):
                return original(*args, **kwargs)
            params = list(params_of(*args, **kwargs))
            dtypes = [own_dtype(p) for p in params]
            with dequant_target(bucket_dtype(dtypes), **layout_of(*args, **kwargs)):
                result = original(*args, **kwargs)
            restore_dtypes(params, dtypes)
            return result

        return wrapper

    factory.__doc__ = why
    return factory


def weights_quantized(init):
    """Whether an ``Init`` quantizes weights (qwZ or MixZ++), from its arguments or its config. Without either,
    its partitioning is left to DeepSpeed untouched."""
    return bool(getattr(init, "quantized_weights", False) or getattr(init, "quantized_nontrainable_weights", False))
