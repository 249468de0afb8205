"""Wrappers installed at DeepSpeed's gather sites. Each one says, in its docstring, why that seam.

All gather-site wrappers share one mechanism: record each parameter's own dtype before the original method
runs, publish a dequantize target for the call (the common dtype, or fp32 for a bucket mixing dtypes, so
every value is rounded only once), and afterwards hand each parameter back in its own dtype. The original
method body always runs unchanged, so other upstream fixes of the installed release are kept.
"""

import torch

from ..dtypes import SUPPORTED_DTYPES
from .scope import dequant_target

MARKER = "__deepspeed_zeropp__"


def own_dtype(param):
    """The dtype a ZeRO-3 parameter must be handed back in.

    The partition (``ds_tensor``) keeps the model dtype unless MixZ++ stored it as int8; the placeholder
    ``param.data`` keeps it otherwise (but unpatched releases leave it fp16 after one gather, hence second)."""
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


def mark(wrapper, original, why):
    """Tag ``wrapper`` as ours: marker attribute, ``__wrapped__``, the original's name, and a docstring that
    says why this seam."""
    setattr(wrapper, MARKER, True)
    wrapper.__wrapped__ = original
    wrapper.__doc__ = why
    for attr in ("__name__", "__qualname__", "__module__"):
        setattr(wrapper, attr, getattr(original, attr, getattr(wrapper, attr)))
    return wrapper


def replace_with(impl):
    """Seam factory for methods we implement ourselves (the quantizer's own methods)."""

    def factory(original):

        def method(*args, **kwargs):
            return impl(*args, **kwargs)

        return method

    return factory


def dtype_scoped(params_of, quantized, group_size_of=lambda *a, **k: None):
    """Seam factory for gather sites: run the original under a dequantize target built from its parameters.

    ``params_of(*args, **kwargs)`` names the parameters the call hands back; ``quantized`` says whether the
    call dequantizes at all (otherwise it runs untouched); ``group_size_of`` gives the group size when the
    gathered codes are the prefix of a padded buffer."""

    def factory(original):

        def wrapper(*args, **kwargs):
            if not quantized(*args, **kwargs):
                return original(*args, **kwargs)
            params = list(params_of(*args, **kwargs))
            dtypes = [own_dtype(p) for p in params]
            with dequant_target(_bucket_dtype(dtypes), group_size_of(*args, **kwargs)):
                result = original(*args, **kwargs)
            _restore_dtypes(params, dtypes)
            return result

        return wrapper

    return factory


# --- how each site names its parameters and its quantization state -------------------------------------------


def _single_handle_quant(handle, *args, **kwargs):
    return getattr(handle, "_AllGatherHandle__quantization", None) if not handle_done(handle) else None


def handle_done(handle):
    return getattr(handle, "_AllGatherHandle__complete", False)


def single_handle_params(handle, *args, **kwargs):
    return [handle._AllGatherHandle__param]


def single_handle_group_size(handle, *args, **kwargs):
    """Group size of the gathered buffer behind the codes. The sequential path narrows the gathered buffer to
    ``ds_numel``; when the partition was padded, ``numel / groups`` no longer gives the group size (upstream
    then maps scales to the wrong elements). The buffer itself still has world_size * partition elements."""
    quant = _single_handle_quant(handle)
    groups = quant.scale_buffer.numel()
    gathered = quant.quantized_param.untyped_storage().nbytes()  # int8: one byte per element
    return gathered // groups if gathered % groups == 0 else None


def bucket_handle_quantized(handle, *args, **kwargs):
    return bool(getattr(handle, "quantization", None)) and not getattr(handle, "complete", False)


def bucket_handle_params(handle, *args, **kwargs):
    return handle.params


def no_gather_param(handle, param, *args, **kwargs):
    return [param]


def no_gather_params(handle, params, *args, **kwargs):
    return list(params)


def holds_quantized_partition(params):
    return any(hasattr(getattr(p, "ds_tensor", None), "ds_quant_scale") for p in params)


def init_param_list(init, param_list, *args, **kwargs):
    return param_list



SINGLE_GATHER = dtype_scoped(single_handle_params, lambda h, *a, **k: _single_handle_quant(h) is not None,
                             single_handle_group_size)
BUCKET_GATHER = dtype_scoped(bucket_handle_params, bucket_handle_quantized)
NO_GATHER = dtype_scoped(no_gather_param, lambda h, p, *a, **k: holds_quantized_partition([p]))
NO_GATHER_COALESCED = dtype_scoped(no_gather_params, lambda h, ps, *a, **k: holds_quantized_partition(ps))
INIT_GATHER = dtype_scoped(init_param_list, lambda init, params, *a, **k: len(params) > 0)
