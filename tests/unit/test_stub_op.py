"""DeepSpeed 0.19.6's own test case: an op that only accepts fp16, behind backend="deepspeed".

The stand-in asserts that its input is fp16 and returns fp16, exactly the contract of DeepSpeed's compiled op.
Through the patched quantizer, bf16 and fp16 parameters round-trip in their own dtype; unpatched, releases
before 0.19.6 hand the op bf16 and it refuses.
"""
import pytest
import torch
from packaging.version import Version

import deepspeed_zeropp
from deepspeed_zeropp.demo.upstream_op import UpstreamOpStandIn


@pytest.fixture
def quantizer_class(monkeypatch):
    from deepspeed.runtime.zero.partition_parameters import CUDAQuantizer
    monkeypatch.setattr(CUDAQuantizer, "quantizer_cuda_module", UpstreamOpStandIn(fp16_only=True))
    yield CUDAQuantizer
    deepspeed_zeropp.unpatch()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_round_trip_in_own_dtype(quantizer_class, dtype):
    deepspeed_zeropp.patch(backend="deepspeed")
    quantizer = quantizer_class()
    param = torch.randn(4096).to(dtype)
    codes, scales = quantizer.quantize(param)
    out = quantizer.dequantize(codes, scales, dtype=param.dtype)
    assert out.dtype == dtype
    assert (out.float() - param.float()).abs().max() <= param.float().abs().max() / 100


def test_unpatched_release_before_fix_fails(quantizer_class):
    import deepspeed
    quantizer = quantizer_class()
    param = torch.randn(4096, dtype=torch.bfloat16)
    if Version(Version(deepspeed.__version__).base_version) < Version("0.19.6"):
        with pytest.raises(AssertionError, match="kernel reads fp16 bits, got torch.bfloat16"):
            quantizer.quantize(param)
    else:  # 0.19.6+ carries upstream's cast-in / cast-out
        codes, scales = quantizer.quantize(param)
        assert quantizer.dequantize(codes, scales, dtype=torch.bfloat16).dtype == torch.bfloat16
