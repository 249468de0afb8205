"""The CUDA extension's native signature tables (csrc/binding.cpp): its entry points answer only what ops.py's checks
passed, exactly as the checked path would, and hand everything else back to ops (None)."""
import numpy as np
import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

from deepspeed_zeropp import ops  # noqa: E402
from deepspeed_zeropp.backends import cuda as cuda_backend  # noqa: E402
from tests.helpers import assert_bitwise  # noqa: E402

NUMEL = 3 * 4096 + 100  # the heuristic layout has a short last group


@pytest.fixture(autouse=True)
def fresh_tables():
    ops.forget_signatures()
    yield
    ops.forget_signatures()


def native():
    return cuda_backend.native_entry_points()


class Subclass(torch.Tensor):
    pass


def checked_then_native(op, *args):
    """The checked path's answer (first call), then the native entry point's for the same arguments."""
    first = getattr(ops, op)(*args)
    fast_quantize, fast_dequantize = native()
    again = (fast_quantize if op == "quantize" else fast_dequantize)(*args)
    assert again is not None, f"the native table did not remember {op}"
    return first, again


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("groups", [None, 4, 7])
def test_quantize_answers_as_the_checked_path(dtype, groups):
    x = torch.randn(NUMEL if groups != 7 else 7 * 1000, device="cuda").to(dtype).view(-1, 4)
    (codes, scales), (again_codes, again_scales) = checked_then_native("quantize", x, groups, "auto")
    assert_bitwise(again_codes, codes)
    assert_bitwise(again_scales, scales)
    assert again_codes.shape == x.shape


@pytest.mark.parametrize("out", [None, torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("layout", ["heuristic", "column scales", "group_size", "block_numel"])
def test_dequantize_answers_as_the_checked_path(out, layout):
    block = 1000 + 3
    x = torch.randn(NUMEL if layout != "block_numel" else 4 * block, device="cuda", dtype=torch.bfloat16)
    if layout == "block_numel":  # four partitions quantized one by one, gathered
        parts = [ops.quantize(part) for part in x.split(block)]
        codes, scales = torch.cat([c for c, _ in parts]), torch.cat([s for _, s in parts])
    else:
        codes, scales = ops.quantize(x, None if layout != "group_size" else 4)
    args = {
        "heuristic": (codes, scales, out, None, None, "cuda"),
        "column scales": (codes, scales.view(-1, 1), out, None, None, "auto"),
        "group_size": (codes[:-5], scales, out, NUMEL // 4, None, "auto"),
        "block_numel": (codes[:-7], scales, out, None, block, "auto"),
    }[layout]
    values, again = checked_then_native("dequantize", *args)
    assert_bitwise(again, values)
    ops.forget_signatures()
    assert_bitwise(ops.dequantize(*args[:5], backend="torch"), values)


def _good():
    x = torch.randn(NUMEL, device="cuda", dtype=torch.bfloat16)
    codes, scales = ops.quantize(x)
    ops.dequantize(codes, scales, torch.float32, None, None)
    return x, codes, scales


# Arguments the native entry points must hand back to ops after a good call with the same element counts.
QUANTIZE_PASSES = {
    "strided input": lambda x: (torch.stack([x, x], 1)[:, 0], None, "auto"),
    "subclass": lambda x: (x.as_subclass(Subclass), None, "auto"),
    "cpu input": lambda x: (x.cpu(), None, "auto"),
    "float64 input": lambda x: (x.double(), None, "auto"),
    "groups True": lambda x: (x, True, "auto"),
    "groups 0": lambda x: (x, 0, "auto"),
    "groups float": lambda x: (x, 4.0, "auto"),
    "groups numpy": lambda x: (x, np.int64(4), "auto"),
    "backend torch": lambda x: (x, None, "torch"),
    "backend deepspeed": lambda x: (x, None, "deepspeed"),
    "backend AUTO": lambda x: (x, None, "AUTO"),
    "backend None": lambda x: (x, None, None),
    "another size": lambda x: (x[1:], None, "auto"),
    "two arguments": lambda x: (x, None),
}

DEQUANTIZE_PASSES = {
    "strided codes": lambda c, s: (torch.stack([c, c], 1)[:, 0], s, torch.float32, None, None, "auto"),
    "cpu scales": lambda c, s: (c, s.cpu(), torch.float32, None, None, "auto"),
    "uint8 codes": lambda c, s: (c.view(torch.uint8), s, torch.float32, None, None, "auto"),
    "float16 scales": lambda c, s: (c, s.half(), torch.float32, None, None, "auto"),
    "scales 1 x S": lambda c, s: (c, s.view(1, -1), torch.float32, None, None, "auto"),
    "scales S x 1 x 1": lambda c, s: (c, s.view(-1, 1, 1), torch.float32, None, None, "auto"),
    "float64 output": lambda c, s: (c, s, torch.float64, None, None, "auto"),
    "dtype name": lambda c, s: (c, s, "float32", None, None, "auto"),
    "group_size True": lambda c, s: (c, s, torch.float32, True, None, "auto"),
    "block_numel -1": lambda c, s: (c, s, torch.float32, None, -1, "auto"),
    "backend torch": lambda c, s: (c, s, torch.float32, None, None, "torch"),
    "subclass codes": lambda c, s: (c.as_subclass(Subclass), s, torch.float32, None, None, "auto"),
    "another dtype": lambda c, s: (c, s, torch.float16, None, None, "auto"),
    "five arguments": lambda c, s: (c, s, torch.float32, None, None),
}


@pytest.mark.parametrize("case", QUANTIZE_PASSES)
def test_quantize_hands_anything_else_to_ops(case):
    x, _, _ = _good()
    fast_quantize, _ = native()
    assert fast_quantize(x, None, "auto") is not None
    assert fast_quantize(*QUANTIZE_PASSES[case](x)) is None


@pytest.mark.parametrize("case", DEQUANTIZE_PASSES)
def test_dequantize_hands_anything_else_to_ops(case):
    _, codes, scales = _good()
    _, fast_dequantize = native()
    assert fast_dequantize(codes, scales, torch.float32, None, None, "auto") is not None
    assert fast_dequantize(*DEQUANTIZE_PASSES[case](codes, scales)) is None


def test_a_parameter_is_served_natively():
    x, codes, scales = _good()
    fast_quantize, _ = native()
    again_codes, again_scales = fast_quantize(torch.nn.Parameter(x, requires_grad=False), None, "auto")
    assert_bitwise(again_codes, codes)
    assert_bitwise(again_scales, scales)


def test_forget_and_the_table_limit(monkeypatch):
    x, codes, scales = _good()
    fast_quantize, fast_dequantize = native()
    ops.forget_signatures()
    assert fast_quantize(x, None, "auto") is None
    assert fast_dequantize(codes, scales, torch.float32, None, None, "auto") is None
    monkeypatch.setattr(ops, "CALLS_LIMIT", 2)
    for size in (NUMEL, NUMEL - 1, NUMEL - 2):
        ops.quantize(x[:size])
    assert fast_quantize(x[:NUMEL - 2], None, "auto") is not None
    assert fast_quantize(x, None, "auto") is None  # emptied when the third signature came


def test_errors_still_come_from_the_checks():
    x, codes, scales = _good()
    with pytest.raises(ValueError, match="positive int dividing numel=.*got True"):
        ops.quantize(x, True)
    with pytest.raises(TypeError, match="dequantize output has dtype torch.float64"):
        ops.dequantize(codes, scales, torch.float64)
    with pytest.raises(ValueError, match=r"shape \[G\] or \[G, 1\]"):
        ops.dequantize(codes, scales.view(1, -1), torch.float32)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_tensors_on_a_device_that_is_not_current():
    """The extension makes the tensors' device current only for the call (it skips the guard when it already is)."""
    x = torch.randn(NUMEL, device="cuda:1", dtype=torch.bfloat16)
    expected_codes, expected_scales = ops.quantize(x.cpu())
    expected = ops.dequantize(expected_codes, expected_scales, torch.float32)
    with torch.cuda.device(0):
        for _ in range(2):  # the checked path, then the native one
            codes, scales = ops.quantize(x)
            values = ops.dequantize(codes, scales, torch.float32)
            assert torch.cuda.current_device() == 0
            assert codes.device == scales.device == values.device == x.device
            assert_bitwise(codes, expected_codes)
            assert_bitwise(scales, expected_scales)
            assert_bitwise(values, expected)
