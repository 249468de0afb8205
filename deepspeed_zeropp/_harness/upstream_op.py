"""A CPU stand-in for DeepSpeed's compiled quantizer op that keeps its dtype behaviour, bug included.

The real op (csrc/quantization/pt_binding.cpp) reads the input buffer as fp16 bits whatever its dtype and
always returns fp16. This stand-in does the same in pure torch, so unpatched DeepSpeed can be run without a GPU
and shows the same failures (dtype errors, corrupted values). One deliberate difference: scales come back 1-D,
because gloo cannot all-gather the op's [G, 1] scales and would fail before the dtype bug shows.

The qgZ calls (``swizzle_quant``, ``quantized_reduction``, 4-bit ``dequantize``) are covered for one device per
node, where the swizzle keeps the order: enough to run unpatched qgZ on CPU with one rank per node.
"""
import torch

from ..backends import torch_ref


def _as_fp16(x, groups):
    """The op's reading of any input: its first 2 * numel bytes as fp16."""
    as_fp16 = x.contiguous().view(-1).view(torch.uint8)[:2 * x.numel()].view(torch.float16)
    if as_fp16.numel() % groups != 0:
        raise RuntimeError(f"stand-in op: {as_fp16.numel()} elements in {groups} groups")
    return as_fp16


def _quantize_int4(values, groups):
    """Symmetric 4-bit codes, two per byte, and one fp32 scale per group."""
    grouped = values.float().view(groups, -1)
    scales = grouped.abs().amax(dim=1).clamp(min=1e-12) / 7
    codes = (grouped / scales.unsqueeze(1)).round().clamp(-8, 7).to(torch.int16) & 0xF
    return (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8).view(torch.int8).view(-1), scales


def _dequantize_int4(packed, scales):
    nibbles = torch.stack([packed.view(torch.uint8) & 0xF, packed.view(torch.uint8) >> 4], dim=-1).to(torch.int16)
    codes = torch.where(nibbles >= 8, nibbles - 16, nibbles).view(scales.numel(), -1)
    return (codes.float() * scales.view(-1, 1)).view(-1)


class UpstreamOpStandIn:
    Symmetric = 0
    Asymmetric = 1

    @staticmethod
    def quantize(x, groups, num_bits, quant_type):
        codes, scales = torch_ref.quantize(_as_fp16(x, groups), groups)
        return codes.view(x.shape), scales

    @staticmethod
    def dequantize(codes, scales, groups, num_bits, quant_type):
        if num_bits == 4:
            return _dequantize_int4(codes, scales).to(torch.float16)
        return torch_ref.dequantize(codes.view(-1), scales.view(-1),
                                    codes.numel() // groups, torch.float16).view(codes.shape)

    @staticmethod
    def swizzle_quant(x, groups, num_bits, quant_type, pipeline, nodes, devices):
        if devices != 1:
            raise RuntimeError(f"stand-in op: swizzle_quant covers one device per node, not {devices}")
        return _quantize_int4(_as_fp16(x, groups), groups)

    @staticmethod
    def quantized_reduction(codes, scales, in_groups, out_groups, num_bits, quant_type, devices):
        summed = sum(_dequantize_int4(*pair) for pair in zip(codes.chunk(devices), scales.chunk(devices)))
        return _quantize_int4(summed.to(torch.float16), out_groups)


def install():
    """Make DeepSpeed's ``CUDAQuantizer`` and qgZ's reduce-scatter use the stand-in instead of building the CUDA op."""
    from deepspeed.runtime.comm import coalesced_collectives
    from deepspeed.runtime.zero.partition_parameters import CUDAQuantizer
    CUDAQuantizer.quantizer_cuda_module = UpstreamOpStandIn()
    coalesced_collectives.quantizer_module = UpstreamOpStandIn()
