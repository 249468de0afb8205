"""ops remembers each checked call signature (ops.py): a remembered signature never serves input the checks would
refuse, nor a different answer from the checked path. Where a CUDA device is present the tests run on it too, through
the CUDA extension."""
import numpy as np
import pytest
import torch

from deepspeed_zeropp import ops
from deepspeed_zeropp.backends import torch_ref

NUMEL, GROUPS = 64, 4  # 4 equal groups of 16, as an explicit count and as block_numel=16

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA"))]


@pytest.fixture(autouse=True)
def fresh_tables():
    ops.forget_signatures()


@pytest.fixture(params=DEVICES)
def device(request):
    return request.param


def _quantized(device):
    return ops.quantize(torch.randn(NUMEL, dtype=torch.bfloat16, device=device), GROUPS)


def _column(scales):
    """scales as [S, 1] that is not contiguous: a column of an [S, 2] tensor."""
    return torch.stack([scales, torch.zeros_like(scales)], dim=1)[:, :1]


def test_a_remembered_call_is_taken_and_matches_the_checked_one(monkeypatch, device):
    x = torch.randn(NUMEL, dtype=torch.bfloat16, device=device)
    codes, scales = ops.quantize(x, GROUPS)
    dense = ops.dequantize(codes, scales.view(-1, 1), torch.float32, block_numel=16)
    monkeypatch.setattr(ops, "_checked_quantize", lambda *args: pytest.fail("quantize took the checked path"))
    monkeypatch.setattr(ops, "_checked_dequantize", lambda *args: pytest.fail("dequantize took the checked path"))
    again_codes, again_scales = ops.quantize(x, GROUPS)
    assert torch.equal(again_codes, codes) and torch.equal(again_scales, scales)
    assert torch.equal(ops.dequantize(codes, scales.view(-1, 1), torch.float32, block_numel=16), dense)


def test_non_contiguous_tensors_on_a_remembered_signature(monkeypatch):
    """The key leaves contiguity out: a remembered call still hands the backend contiguous tensors (the pure-torch
    one would cope with strided ones; the CUDA extension refuses them)."""
    for name in ("quantize", "dequantize"):
        real = getattr(torch_ref, name)

        def contiguous_only(*args, real=real):
            assert all(a.is_contiguous() for a in args if isinstance(a, torch.Tensor)), "a strided tensor"
            return real(*args)

        monkeypatch.setattr(torch_ref, name, contiguous_only)
    x = torch.randn(NUMEL, 2, dtype=torch.float16)
    ops.quantize(x[:, 0].contiguous(), GROUPS)
    codes, scales = ops.quantize(x[:, 0], GROUPS)  # the same key, a strided input
    expected_codes, expected_scales = ops.quantize(x[:, 0].contiguous(), GROUPS)
    assert torch.equal(codes, expected_codes) and torch.equal(scales, expected_scales)
    expected = ops.dequantize(codes, scales.view(-1, 1))
    strided_codes = torch.stack([codes, codes], dim=1)[:, 0]
    assert torch.equal(ops.dequantize(strided_codes, _column(scales)), expected)


# Each bad call shares all but one part of the key with a good call made first.
QUANTIZE_REFUSALS = [
    (lambda x: (x.to("meta"), GROUPS), ValueError, "quantize input is on the meta device"),
    (lambda x: (x.to(torch.float64), GROUPS), TypeError, "torch.float64.*supports torch.float16"),
    (lambda x: (x.tolist(), GROUPS), TypeError, "quantize input must be a torch.Tensor, got list"),
    (lambda x: (x, float(GROUPS)), ValueError, "positive int dividing numel=64, got 4.0"),
    (lambda x: (x, np.int64(GROUPS)), ValueError, "positive int dividing numel=64, got .*4"),
    (lambda x: (x, [GROUPS]), ValueError, r"positive int dividing numel=64, got \[4\]"),
]


@pytest.mark.parametrize("bad, error, message", QUANTIZE_REFUSALS)
def test_quantize_refusals_after_a_good_call(bad, error, message, device):
    x = torch.randn(NUMEL, dtype=torch.bfloat16, device=device)
    ops.quantize(x, GROUPS)
    ops.quantize(x, GROUPS)
    with pytest.raises(error, match=message) as raised:
        ops.quantize(*bad(x))
    assert raised.value.__context__ is None


def test_quantize_groups_true_after_groups_one(device):
    x = torch.randn(8, device=device)
    ops.quantize(x, 1)
    with pytest.raises(ValueError, match="positive int dividing numel=8, got True"):
        ops.quantize(x, True)


DEQUANTIZE_REFUSALS = [
    (lambda c, s: ((c, s.to("meta")), {}), ValueError, "dequantize scales is on the meta device"),
    (lambda c, s: ((c.to("meta"), s.to("meta")), {}), ValueError, "dequantize codes is on the meta device"),
    (lambda c, s: ((c.view(torch.uint8), s), {}), TypeError, "codes have dtype torch.uint8; expected torch.int8"),
    (lambda c, s: ((c, s.half()), {}), TypeError, "scales have dtype torch.float16; expected torch.float32"),
    (lambda c, s: ((c, s.view(1, -1)), {}), ValueError, r"shape \[G\] or \[G, 1\] with G >= 1, got \(1, 4\)"),
    (lambda c, s: ((c, s[:3]), {}), ValueError, "64 codes cannot be split into 3 equal groups"),
    (lambda c, s: ((c[:63], s), {}), ValueError, "63 codes cannot be split into 4 equal groups"),
    (lambda c, s: ((c, s), {
        "dtype": torch.float64
    }), TypeError, "dequantize output has dtype torch.float64"),
    (lambda c, s: ((c.tolist(), s), {}), TypeError, "dequantize codes must be a torch.Tensor, got list"),
    (lambda c, s: ((c, s.tolist()), {}), TypeError, "dequantize scales must be a torch.Tensor, got list"),
    (lambda c, s: ((c, s), {
        "backend": "fast"
    }), ValueError, "unknown backend 'fast'; choose one of auto"),
]


@pytest.mark.parametrize("bad, error, message", DEQUANTIZE_REFUSALS)
def test_dequantize_refusals_after_a_good_call(bad, error, message, device):
    codes, scales = _quantized(device)
    ops.dequantize(codes, scales)
    ops.dequantize(codes, scales)
    args, kwargs = bad(codes, scales)
    with pytest.raises(error, match=message) as raised:
        ops.dequantize(*args, **kwargs)
    assert raised.value.__context__ is None  # the checks' own error, no failed lookup chained to it


def test_a_prefix_of_the_codes_gets_its_own_layout(device):
    """60 codes with 4 scales are 4 groups of 15, not the 16 a remembered 64-code call uses."""
    codes, scales = _quantized(device)
    ops.dequantize(codes, scales)
    remembered = ops.dequantize(codes[:60], scales)
    ops.forget_signatures()
    assert torch.equal(remembered, ops.dequantize(codes[:60], scales))
    assert torch.equal(remembered, codes[:60].float().view(4, 15).mul(scales.view(4, 1)).half().view(-1))


@pytest.mark.parametrize("argument, good, bad, message", [
    ("group_size", 16, 16.0, "group_size must be a positive int, got 16.0"),
    ("group_size", 16, np.int64(16), "group_size must be a positive int, got .*16"),
    ("block_numel", 16, 16.0, "block_numel must be a positive int, got 16.0"),
    ("block_numel", 16, np.int64(16), "block_numel must be a positive int, got .*16"),
])
def test_layout_arguments_of_an_equal_value_but_another_type(argument, good, bad, message, device):
    codes, scales = _quantized(device)
    ops.dequantize(codes, scales, **{argument: good})
    with pytest.raises(ValueError, match=message):
        ops.dequantize(codes, scales, **{argument: bad})


def test_group_size_true_after_group_size_one(device):
    codes, scales = ops.quantize(torch.randn(8, device=device), 8)
    ops.dequantize(codes, scales, group_size=1)
    with pytest.raises(ValueError, match="group_size must be a positive int, got True"):
        ops.dequantize(codes, scales, group_size=True)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a second real device")
def test_scales_on_another_device_after_a_good_call():
    codes, scales = _quantized("cpu")
    ops.dequantize(codes, scales)
    with pytest.raises(ValueError, match="scales are on cuda.*codes on cpu.*same device"):
        ops.dequantize(codes, scales.cuda())
    codes, scales = _quantized("cuda")
    ops.dequantize(codes, scales)
    with pytest.raises(ValueError, match="scales are on cpu.*codes on cuda.*same device"):
        ops.dequantize(codes, scales.cpu())


def test_the_tables_stay_bounded(monkeypatch, device):
    monkeypatch.setattr(ops, "CALLS_LIMIT", 3)
    for numel in range(16, 16 + 8 * 10, 8):
        x = torch.randn(numel, device=device)
        codes, scales = ops.quantize(x)
        assert torch.equal(ops.dequantize(codes, scales, torch.float32),
                           ops.dequantize(codes, scales, torch.float32, backend="torch"))
        assert len(ops._quantize_calls) <= 3 and len(ops._dequantize_calls) <= 3
