"""The layout each patched gather site publishes: one quantized block per rank, each with its own short last group.

Handles are stand-ins holding exactly what the seams read; their ``wait`` dequantizes as DeepSpeed's does (no dtype,
no layout), so only the published target can get the values right. hpZ's secondary partitions are covered here;
the multi-rank tests run the same seams in real ZeRO-3 training.
"""
import warnings
from types import SimpleNamespace

import pytest
import torch

from deepspeed_zeropp import ops
from deepspeed_zeropp.backends import deepspeed_op
from deepspeed_zeropp.demo.upstream_op import UpstreamOpStandIn
from deepspeed_zeropp.formats.grouping import blocks_of, group_layout
from deepspeed_zeropp.patching.seams import gathers
from deepspeed_zeropp.patching.quantizer import QuantizerMethods

PRIME = 8581  # a 131 x 131 weight's partition at 2 ranks: two groups, the second one shorter
RANKS = 2


def partitions(numel, seed, dtype=torch.bfloat16):
    """A parameter of ``numel`` elements cut into RANKS zero-padded partitions, each quantized on its own."""
    size = -(-numel // RANKS)
    full = torch.randn(numel, generator=torch.Generator().manual_seed(seed)).to(dtype)
    parts = torch.nn.functional.pad(full, (0, size * RANKS - numel)).view(RANKS, size)
    quantized = [ops.quantize(part, backend="torch") for part in parts]
    expected = torch.cat([ops.dequantize(c, s, dtype=dtype, backend="torch") for c, s in quantized])
    return full, parts, quantized, expected


def param_with(full, partition, secondary=None):
    param = torch.nn.Parameter(torch.empty(0, dtype=full.dtype), requires_grad=False)
    param.ds_tensor, param.ds_secondary_tensor, param.ds_numel = partition, secondary, full.numel()
    for part in (partition, secondary):
        if part is not None:
            part.ds_numel = part.numel()
    return param


def test_single_gather_narrowed_to_the_parameter():
    """AllGatherHandle.wait: the gathered codes are narrowed to ds_numel (17161 of 2 x 8581)."""
    assert not group_layout(PRIME).covers_exactly(PRIME)
    full, parts, quantized, expected = partitions(2 * PRIME - 1, seed=1)
    codes = torch.cat([c for c, _ in quantized])[:full.numel()]
    scales = torch.cat([s for _, s in quantized])
    param = param_with(full, parts[0].clone())

    class Handle:
        _AllGatherHandle__param = param
        _AllGatherHandle__complete = False
        _AllGatherHandle__quantization = SimpleNamespace(quantized_param=codes, scale_buffer=scales)

        def wait(self):
            param.data = QuantizerMethods().dequantize(codes, scales)

    gathers.single_gather(Handle.wait)(Handle())
    assert param.dtype == torch.bfloat16 and torch.equal(param.data, expected[:full.numel()])


def test_single_gather_of_hpz_secondary_partition():
    """With hpZ the parameter's secondary partition is what each rank all-gathered (upstream picks it whenever the
    parameter has one), so it sets the block size, not the primary partition."""
    full, secondary, quantized, expected = partitions(2 * PRIME, seed=2)
    param = param_with(full, torch.empty(-(-full.numel() // 4), dtype=full.dtype), secondary[0].clone())
    handle = SimpleNamespace(_AllGatherHandle__param=param)
    assert gathers._single_layout(handle) == {"layout": blocks_of(PRIME)}
    assert blocks_of(PRIME).block_numel == PRIME  # a short last group per block: the block numel is kept
    param.ds_secondary_tensor = None
    assert gathers._single_layout(handle) == {"layout": blocks_of(-(-full.numel() // 4))}


def test_target_layouts():
    """A seam that knows the per-rank numel publishes its GatheredLayout, read as it is; ``blocks`` gives the layout
    of each call's codes (k equal per-rank blocks of them)."""
    from deepspeed_zeropp.patching.scope import DequantTarget
    codes = torch.zeros(2 * PRIME, dtype=torch.int8)
    layout = blocks_of(PRIME)
    assert DequantTarget(torch.bfloat16, layout=layout).layout_of(codes) is layout
    assert DequantTarget(torch.bfloat16, blocks=2).layout_of(codes) == blocks_of(PRIME)
    assert DequantTarget(torch.bfloat16, blocks=2).layout_of(codes[:0]) is None  # empty blocks: one (empty) buffer
    assert DequantTarget(torch.bfloat16).layout_of(codes) is None
    with pytest.raises(ValueError, match="cannot be 3 equal per-rank blocks"):
        DequantTarget(torch.bfloat16, blocks=3).layout_of(codes[:-1])


@pytest.mark.parametrize("secondary", [False, True], ids=["primary", "hpz-secondary"])
@pytest.mark.parametrize("stored", [False, True], ids=["qwz", "mixz-stored"])
def test_bucket_gather(stored, secondary):
    """AllGatherCoalescedHandle.wait: each rank quantized the concatenation of its partitions of the bucket (one
    block per rank), or, for stored MixZ++ codes, each partition on its own (one block per partition and rank)."""
    params, all_parts = [], []
    for seed, numel in enumerate((2 * PRIME - 1, 131, 2 * 24000)):
        full, parts, quantized, _ = partitions(numel, seed)
        partition = (quantized[0][0].clone() if stored else parts[0].clone())
        if stored:
            partition.ds_quant_scale = quantized[0][1]
        primary = torch.empty(0, dtype=full.dtype) if secondary else partition
        param = param_with(full, primary, partition if secondary else None)
        params.append(param)
        all_parts.append(parts)
    per_rank = [torch.cat([parts[rank] for parts in all_parts]) for rank in range(RANKS)]
    if stored:
        blocks = [ops.quantize(parts[rank], backend="torch") for rank in range(RANKS) for parts in all_parts]
    else:
        blocks = [ops.quantize(block, backend="torch") for block in per_rank]
    codes = torch.cat([c for c, _ in blocks])
    scales = torch.cat([s for _, s in blocks])
    expected = torch.cat([ops.dequantize(c, s, dtype=torch.bfloat16, backend="torch") for c, s in blocks])
    assert stored or not group_layout(per_rank[0].numel()).covers_exactly(per_rank[0].numel())
    handle = SimpleNamespace(params=params,
                             use_secondary_tensor=secondary,
                             world_size=RANKS,
                             complete=False,
                             quantization=SimpleNamespace(quantized_param=codes, scale_buffer=scales))
    out = {}

    def wait(handle):
        out["flat"] = QuantizerMethods().dequantize(handle.quantization.quantized_param,
                                                    handle.quantization.scale_buffer)

    gathers.bucket_gather(wait)(handle)
    assert out["flat"].dtype == torch.bfloat16 and torch.equal(out["flat"], expected)


def test_deepspeed_backend_hands_short_last_groups_to_the_native_path(monkeypatch):
    """DeepSpeed's op knows equal groups only: DeepSpeed's own group sizes still go to it (fp16 in and out), other
    layouts take the native path, with one warning."""
    from deepspeed.runtime.zero.partition_parameters import CUDAQuantizer
    monkeypatch.setattr(CUDAQuantizer, "quantizer_cuda_module", UpstreamOpStandIn(fp16_only=True))
    monkeypatch.setattr(deepspeed_op, "_warned_layout", False)
    x = torch.randn(2 * PRIME, dtype=torch.bfloat16)
    uniform = ops.quantize(x[:16384], backend="deepspeed")
    assert torch.equal(uniform[0], ops.quantize(x[:16384].half(), backend="torch")[0])
    with pytest.warns(UserWarning, match="only handles equal groups"):
        codes, scales = ops.quantize(x[:PRIME], backend="deepspeed")
    native = ops.quantize(x[:PRIME], backend="torch")
    assert torch.equal(codes, native[0]) and torch.equal(scales, native[1])
    gathered = torch.cat([codes, codes]), torch.cat([scales, scales])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once already
        out = ops.dequantize(*gathered, dtype=torch.bfloat16, block_numel=PRIME, backend="deepspeed")
    assert torch.equal(out, ops.dequantize(*gathered, dtype=torch.bfloat16, block_numel=PRIME, backend="torch"))
