"""Bad input is refused with an error naming what was wrong and what is accepted."""
import pytest
import torch

from deepspeed_zeropp import ops


@pytest.mark.parametrize("dtype", [torch.int8, torch.int32, torch.float64, torch.complex64, torch.float8_e4m3fn])
def test_unsupported_input_dtype(dtype):
    with pytest.raises(TypeError, match=rf"{dtype}.*supports torch.float16, torch.bfloat16, torch.float32"):
        ops.quantize(torch.zeros(8, dtype=dtype))


def test_unsupported_output_dtype():
    codes, scales = ops.quantize(torch.randn(8))
    with pytest.raises(TypeError, match="dequantize output has dtype torch.float64"):
        ops.dequantize(codes, scales, dtype=torch.float64)


def test_not_a_tensor():
    with pytest.raises(TypeError, match="expects a torch.Tensor, got list"):
        ops.quantize([1.0, 2.0])


@pytest.mark.parametrize("groups", [0, 3, -1, 2.0])
def test_groups_must_divide(groups):
    with pytest.raises(ValueError, match="positive int dividing numel=8"):
        ops.quantize(torch.randn(8), groups)


def test_wire_tensor_checks():
    codes, scales = ops.quantize(torch.randn(8), 2)
    with pytest.raises(TypeError, match="codes have dtype torch.int32; expected torch.int8"):
        ops.dequantize(codes.int(), scales)
    with pytest.raises(TypeError, match="scales have dtype torch.float16; expected torch.float32"):
        ops.dequantize(codes, scales.half())
    with pytest.raises(ValueError, match=r"shape \[G\] or \[G, 1\]"):
        ops.dequantize(codes, scales.view(1, 2))
    with pytest.raises(ValueError, match="8 codes cannot be split into 3 equal groups"):
        ops.dequantize(codes, torch.ones(3))
    with pytest.raises(ValueError, match="8 codes do not fit 2 groups of 3"):
        ops.dequantize(codes, scales, group_size=3)
