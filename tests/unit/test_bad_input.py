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
    with pytest.raises(TypeError, match="quantize input must be a torch.Tensor, got list"):
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


def test_groups_must_not_be_a_bool():
    with pytest.raises(ValueError, match="positive int dividing numel=8, got True"):
        ops.quantize(torch.randn(8), groups=True)


def test_codes_and_scales_must_be_tensors():
    codes, scales = ops.quantize(torch.randn(8), 2)
    with pytest.raises(TypeError, match="dequantize codes must be a torch.Tensor, got list"):
        ops.dequantize(codes.tolist(), scales)
    with pytest.raises(TypeError, match="dequantize scales must be a torch.Tensor, got list"):
        ops.dequantize(codes, scales.tolist())


def test_meta_and_mismatched_devices():
    codes, scales = ops.quantize(torch.randn(8), 2)
    with pytest.raises(ValueError, match="dequantize scales is on the meta device"):
        ops.dequantize(codes, scales.to("meta"))
    with pytest.raises(ValueError, match="dequantize codes is on the meta device"):
        ops.dequantize(codes.to("meta"), scales.to("meta"))
    with pytest.raises(ValueError, match="quantize input is on the meta device"):
        ops.quantize(torch.randn(8, device="meta"))
    if torch.cuda.is_available():
        with pytest.raises(ValueError, match="scales are on cuda.*codes on cpu.*same device"):
            ops.dequantize(codes, scales.cuda())


@pytest.mark.parametrize("block_numels", [[40, -8], [True, 31], [(3, 8), (1, 8)], [16.0, 16], "32", None])
def test_segments_must_be_non_negative_counts(block_numels):
    codes, scales = ops.quantize(torch.randn(32), 4)
    with pytest.raises(ValueError, match=r"block_numels must be a list of non-negative ints"):
        ops.dequantize_segments(codes, scales, block_numels)


def test_deepspeed_backend_dequantizes_a_prefix(monkeypatch):
    """The prefix of a padded gathered buffer, through DeepSpeed's op (a CPU stand-in with its fp16 contract):
    the op sees whole groups, the caller gets the prefix back."""
    from deepspeed_zeropp.backends import deepspeed_op
    from deepspeed_zeropp.demo.upstream_op import UpstreamOpStandIn
    monkeypatch.setattr(deepspeed_op, "_op", UpstreamOpStandIn)
    x = torch.randn(16, dtype=torch.float16)
    codes, scales = ops.quantize(x, 2, backend="deepspeed")
    out = ops.dequantize(codes[:10], scales, dtype=torch.bfloat16, group_size=8, backend="deepspeed")
    expected = ops.dequantize(codes[:10], scales, dtype=torch.float16, group_size=8, backend="torch")
    assert out.dtype == torch.bfloat16 and torch.equal(out, expected.to(torch.bfloat16))
