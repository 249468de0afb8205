"""DeepSpeed's own compiled quantizer, used the way upstream 0.19.6+ uses it (for users who want its numerics).

The op only reads and writes fp16, so values are converted to fp16 on the way in and the fp16 result is
converted to the requested dtype on the way out (what DeepSpeed does from 0.19.6). This detour loses range and
precision for bf16/fp32; the native backends do not take it. The op only knows equal groups: layouts with a short
last group (sizes where DeepSpeed's own heuristic asserts, see formats/grouping.py) go to the native backend instead.

DeepSpeed's op has no qgZ codec that keeps dtypes, so this backend does not serve qgZ (``SERVES_QGZ``): the registry
hands qgZ to ``auto`` (backends/__init__.py, ``qgz_backend_name``).
"""
import warnings

import torch

from . import resolve_backend

NAME = "deepspeed"
SERVES_QGZ = False
_warned_layout = False


def _op():
    """The op DeepSpeed itself uses: ``CUDAQuantizer.quantizer_cuda_module``, built on first use as upstream does."""
    from deepspeed.runtime.zero.partition_parameters import CUDAQuantizer
    if CUDAQuantizer.quantizer_cuda_module is None:
        from deepspeed.ops.op_builder import QuantizerBuilder
        CUDAQuantizer.quantizer_cuda_module = QuantizerBuilder().load()
    return CUDAQuantizer.quantizer_cuda_module


def _native(device):
    """The backend ``auto`` picks for ``device``, warned about once."""
    global _warned_layout
    if not _warned_layout:
        warnings.warn("deepspeed_zeropp: DeepSpeed's quantizer op only handles equal groups; sizes whose groups "
                      "end in a shorter one (where DeepSpeed's own group heuristic fails) use the native backend")
        _warned_layout = True
    return resolve_backend("auto", device)


def quantize(x, groups, group_size=None):
    if group_size is not None and groups * group_size != x.numel():
        return _native(x.device).quantize(x, groups, group_size)
    op = _op()
    codes, scales = op.quantize(x.reshape(-1).to(torch.float16), groups, 8, op.Symmetric)
    return codes.view(x.shape), scales.view(-1)


def dequantize(codes, scales, layout, dtype):
    if not layout.uniform:
        return _native(codes.device).dequantize(codes, scales, layout, dtype)
    op = _op()
    shape, codes = codes.shape, codes.reshape(-1)
    numel, padded_numel = codes.numel(), scales.numel() * layout.group_size
    whole = codes if numel == padded_numel else torch.cat([codes, codes.new_zeros(padded_numel - numel)])
    out = op.dequantize(whole, scales.view(-1, 1), scales.numel(), 8, op.Symmetric).view(-1)
    return out[:numel].view(shape).to(dtype)  # the op needs whole groups: the prefix was padded, now cut back


def _no_qgz(*args, **kwargs):
    raise NotImplementedError("backend 'deepspeed' does not implement qgZ; deepspeed_zeropp.backends.qgz_backend "
                              "names the backend that serves it")


qgz_encode = qgz_reduce_encode = qgz_decode_sum = _no_qgz
