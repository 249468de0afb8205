"""The demo's CPU stand-in for DeepSpeed's compiled quantizer op (``deepspeed_zeropp.demo.worker``: fp16 in and out
whatever the dtype, bug included, so unpatched DeepSpeed runs without a GPU and shows the same failures), with qgZ.

The qgZ calls (``swizzle_quant``, ``quantized_reduction``, 4-bit ``dequantize``) are covered for one device per
node, where the swizzle keeps the order: enough to run unpatched qgZ on CPU with one rank per node.
"""
import torch

from deepspeed_zeropp.demo.worker import UpstreamOpStandIn as WeightOpStandIn
from deepspeed_zeropp.demo.worker import install_stand_in


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


class UpstreamOpStandIn(WeightOpStandIn):

    @staticmethod
    def dequantize(codes, scales, groups, num_bits, quant_type):
        if num_bits == 4:
            return _dequantize_int4(codes, scales).to(torch.float16)
        return WeightOpStandIn.dequantize(codes, scales, groups, num_bits, quant_type)

    @staticmethod
    def swizzle_quant(x, groups, num_bits, quant_type, pipeline, nodes, devices):
        if devices != 1:
            raise RuntimeError(f"stand-in op: swizzle_quant covers one device per node, not {devices}")
        return _quantize_int4(UpstreamOpStandIn.as_fp16(x, groups), groups)

    @staticmethod
    def quantized_reduction(codes, scales, in_groups, out_groups, num_bits, quant_type, devices):
        summed = sum(_dequantize_int4(*pair) for pair in zip(codes.chunk(devices), scales.chunk(devices)))
        return _quantize_int4(summed.to(torch.float16), out_groups)


def install():
    """Make DeepSpeed's ``CUDAQuantizer`` and qgZ's reduce-scatter use the stand-in instead of building the CUDA op."""
    from deepspeed.runtime.comm import coalesced_collectives
    install_stand_in(UpstreamOpStandIn)
    coalesced_collectives.quantizer_module = UpstreamOpStandIn()
