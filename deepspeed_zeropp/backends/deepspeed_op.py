"""DeepSpeed's own compiled quantizer, used the way upstream 0.19.6+ uses it (for users who want its numerics).

The op only reads and writes fp16, so values are converted to fp16 on the way in and the fp16 result is
converted to the requested dtype on the way out (DeepSpeed PR #8215's behaviour). This detour loses range and
precision for bf16/fp32; the native backends do not take it.
"""
import torch


def _op():
    """The op DeepSpeed itself uses: ``CUDAQuantizer.quantizer_cuda_module``, built on first use as upstream does."""
    from deepspeed.runtime.zero.partition_parameters import CUDAQuantizer
    if CUDAQuantizer.quantizer_cuda_module is None:
        from deepspeed.ops.op_builder import QuantizerBuilder
        CUDAQuantizer.quantizer_cuda_module = QuantizerBuilder().load()
    return CUDAQuantizer.quantizer_cuda_module


def quantize(flat, groups):
    op = _op()
    codes, scales = op.quantize(flat.to(torch.float16), groups, 8, op.Symmetric)
    return codes.view(-1), scales.view(-1)


def dequantize(codes, scales, group_size, dtype):
    op = _op()
    numel, padded_numel = codes.numel(), scales.numel() * group_size
    whole = codes if numel == padded_numel else torch.cat([codes, codes.new_zeros(padded_numel - numel)])
    out = op.dequantize(whole, scales.view(-1, 1), scales.numel(), 8, op.Symmetric).view(-1)
    return out[:numel].to(dtype)  # the op needs whole groups: the prefix was padded, now cut back
