"""The one CPU stand-in for DeepSpeed's compiled quantizer op, for the demo, the test harness and the unit tests.

DeepSpeed's op exists only as a CUDA build, so on CPU unpatched DeepSpeed cannot quantize at all. The stand-in
takes the op's place (``install``): fp16 in and fp16 out whatever the parameters' dtype, bug included, so unpatched
DeepSpeed runs without a GPU and shows the same failures. It ships with the package because the installed demo
uses it; the harness and the tests import it from here.

The qgZ calls (``swizzle_quant``, ``quantized_reduction``, 4-bit ``dequantize``) are covered for one device per
node, where the swizzle keeps the order: enough to run unpatched qgZ on CPU with one rank per node.
"""
import torch

from ..backends import torch_ref
from ..formats.grouping import equal_groups


class UpstreamOpStandIn:
    """DeepSpeed's compiled int8 quantizer op on CPU, dtype behaviour included: it reads its input buffer as fp16
    bits whatever the dtype and always returns fp16. One deliberate difference: scales come back 1-D, because gloo
    cannot all-gather the op's [G, 1] scales and would fail before the dtype bug shows.

    ``fp16_only=True``: the op's contract exactly, as the unit tests check it without a process group: any input
    that is not fp16 is refused (AssertionError), and scales come back [G, 1]."""
    Symmetric = 0
    Asymmetric = 1

    def __init__(self, fp16_only=False):
        self.fp16_only = fp16_only

    def as_fp16(self, x, groups):
        """The op's reading of any input: its first 2 * numel bytes as fp16 (``fp16_only``: fp16 input only)."""
        if self.fp16_only:
            assert x.dtype == torch.float16, f"kernel reads fp16 bits, got {x.dtype}"
        as_fp16 = x.contiguous().view(-1).view(torch.uint8)[:2 * x.numel()].view(torch.float16)
        if as_fp16.numel() % groups != 0:
            raise RuntimeError(f"stand-in op: {as_fp16.numel()} elements in {groups} groups")
        return as_fp16

    def quantize(self, x, groups, num_bits, quant_type):
        codes, scales = torch_ref.quantize(self.as_fp16(x, groups), groups)
        return codes.view(x.shape), scales.view(-1, 1) if self.fp16_only else scales

    def dequantize(self, codes, scales, groups, num_bits, quant_type):
        if num_bits == 4:
            return _dequantize_int4(codes, scales).to(torch.float16)
        return torch_ref.dequantize(codes.reshape(-1), scales.reshape(-1), equal_groups(codes.numel() // groups),
                                    torch.float16).view(codes.shape)

    def swizzle_quant(self, x, groups, num_bits, quant_type, pipeline, nodes, devices):
        if devices != 1:
            raise RuntimeError(f"stand-in op: swizzle_quant covers one device per node, not {devices}")
        return _quantize_int4(self.as_fp16(x, groups), groups)

    def quantized_reduction(self, codes, scales, in_groups, out_groups, num_bits, quant_type, devices):
        summed = sum(_dequantize_int4(*pair) for pair in zip(codes.chunk(devices), scales.chunk(devices)))
        return _quantize_int4(summed.to(torch.float16), out_groups)


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


def install(gradients=False):
    """Make DeepSpeed's ``CUDAQuantizer`` (and with ``gradients`` qgZ's reduce-scatter too) use the stand-in instead
    of building the CUDA op."""
    from deepspeed.runtime.zero.partition_parameters import CUDAQuantizer
    CUDAQuantizer.quantizer_cuda_module = UpstreamOpStandIn()
    if gradients:
        from deepspeed.runtime.comm import coalesced_collectives
        coalesced_collectives.quantizer_module = UpstreamOpStandIn()
