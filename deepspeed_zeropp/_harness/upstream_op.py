"""A CPU stand-in for DeepSpeed's compiled quantizer op that keeps its dtype behaviour, bug included.

The real op (csrc/quantization/pt_binding.cpp) reads the input buffer as fp16 bits whatever its dtype and
always returns fp16. This stand-in does the same in pure torch, so unpatched DeepSpeed can be run without a GPU
and shows the same failures (dtype errors, corrupted values). One deliberate difference: scales come back 1-D,
because gloo cannot all-gather the op's [G, 1] scales and would fail before the dtype bug shows.
"""
import torch

from ..backends import torch_ref


class UpstreamOpStandIn:
    Symmetric = 0
    Asymmetric = 1

    @staticmethod
    def quantize(x, groups, num_bits, quant_type):
        as_fp16 = x.contiguous().view(-1).view(torch.uint8)[:2 * x.numel()].view(torch.float16)
        if as_fp16.numel() % groups != 0:
            raise RuntimeError(f"stand-in op: {as_fp16.numel()} elements in {groups} groups")
        codes, scales = torch_ref.quantize(as_fp16, groups)
        return codes.view(x.shape), scales

    @staticmethod
    def dequantize(codes, scales, groups, num_bits, quant_type):
        return torch_ref.dequantize(codes.view(-1), scales.view(-1),
                                    codes.numel() // groups, torch.float16).view(codes.shape)


def install():
    """Make DeepSpeed's ``CUDAQuantizer`` use the stand-in instead of building its CUDA op."""
    from deepspeed.runtime.zero.partition_parameters import CUDAQuantizer
    CUDAQuantizer.quantizer_cuda_module = UpstreamOpStandIn()
