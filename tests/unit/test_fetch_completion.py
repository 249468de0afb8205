"""The fetch protocol's completion of a wait (patching/seams/fetch.py) against what upstream's wait computes from
the same gathered bytes: each rank's block dequantized on its own (torch reference), then every parameter's part
of every rank concatenated and cut to its numel. Bit for bit, in every dtype, for padded partitions, mixed-dtype
buckets and hpZ's secondary partitions; the handle and the parameters are left as upstream leaves them."""
import enum
import math
from types import SimpleNamespace

import pytest
import torch

from deepspeed_zeropp import backends, ops
from deepspeed_zeropp.formats.grouping import group_layout
from deepspeed_zeropp.patching.seams import fetch


class Status(enum.Enum):  # DeepSpeed's ZeroParamStatus has these members; the completion reads them off the param
    NOT_AVAILABLE = 1
    INFLIGHT = 2
    AVAILABLE = 3


class Work:

    def __init__(self):
        self.waits = 0

    def wait(self):
        self.waits += 1


def _param(shape, dtype, ranks, groups=1):
    """A ZeRO-3 parameter stand-in: its full values, its partition numel per rank (hpZ: ``groups`` partitions per
    secondary part), shape and status."""
    numel = math.prod(shape)
    part = -(-numel // (ranks * groups))
    values = torch.randn(numel, dtype=torch.float32).mul_(3).to(dtype)
    return SimpleNamespace(full=values,
                           part=part * groups,
                           ds_tensor=SimpleNamespace(ds_numel=part, dtype=dtype),
                           ds_secondary_tensor_num_of_groups=groups,
                           ds_numel=numel,
                           ds_shape=shape,
                           ds_status=Status.INFLIGHT,
                           data=torch.empty(0, dtype=dtype))


def _gathered(params, ranks, common):
    """(received bytes, packet layout, each rank's float block): every rank quantizes the concatenation of its
    parts (padded with zeros), as DeepSpeed's fetch does, into a packet."""
    blocks, packets = [], []
    for rank in range(ranks):
        parts = []
        for p in params:
            padded = torch.cat([p.full.to(common), p.full.new_zeros(ranks * p.part - p.ds_numel).to(common)])
            parts.append(padded[rank * p.part:(rank + 1) * p.part])
        block = torch.cat(parts)
        codes, _ = ops.quantize_packed(block, backend="torch")
        info = ops.packet_of(codes)
        blocks.append(block)
        packets.append(info.buffer)
    return torch.cat(packets), info.layout, blocks


def _upstream(params, received, layout, ranks, dtypes):
    """What upstream's wait hands back from the same bytes: per rank dequantized (fp32 reference, rounded once to
    the bucket's dtype), per parameter narrowed per rank, concatenated, cut, cast to the parameter's dtype."""
    common = dtypes[0] if len(set(dtypes)) == 1 else torch.float32
    rows = received.view(ranks, layout.nbytes)
    flat = []
    for r in range(ranks):
        codes = rows[r, :layout.numel].view(torch.int8)
        scales = rows[r, layout.scales_at:layout.scales_at + 4 * layout.groups].view(torch.float32)
        flat.append(ops.dequantize(codes.clone(), scales.clone(), common, backend="torch"))
    out, at = [], 0
    for p, dtype in zip(params, dtypes):
        whole = torch.cat([flat[r][at:at + p.part] for r in range(ranks)])[:p.ds_numel]
        out.append(whole.view(p.ds_shape).to(dtype))
        at += p.part
    return out


CASES = {
    "bf16": ([(64, 33), (7, ), (129, 5)], [torch.bfloat16] * 3, 4, 1),
    "fp16": ([(1000, ), (3, 3)], [torch.float16] * 2, 8, 1),
    "fp32": ([(17, 19), (4096, )], [torch.float32] * 2, 3, 1),
    "mixed": ([(50, 3), (31, ), (8, 8)], [torch.bfloat16, torch.float32, torch.float16], 4, 1),
    "hpz": ([(96, 7), (13, )], [torch.bfloat16] * 2, 2, 4),
    "many ranks": ([(4000, 3)], [torch.bfloat16], 64, 1),
}


@pytest.fixture(autouse=True)
def torch_backend():
    before = backends.default()
    backends.set_default("torch")
    yield
    backends.set_default(before)


@pytest.mark.parametrize("case", CASES)
def test_bucket_completion_is_upstreams_wait(case):
    shapes, dtypes, ranks, groups = CASES[case]
    params = [_param(shape, dtype, ranks, groups) for shape, dtype in zip(shapes, dtypes)]
    common = dtypes[0] if len(set(dtypes)) == 1 else torch.float32
    received, layout, _ = _gathered(params, ranks, common)
    assert group_layout(layout.numel).groups == layout.groups
    work = fetch.PacketGather(Work(), received, layout)
    handle = SimpleNamespace(allgather_handle=work,
                             quantization=SimpleNamespace(quant_handle=work),
                             params=params,
                             use_secondary_tensor=groups > 1,
                             complete=False)
    expected = _upstream(params, received, layout, ranks, dtypes)
    fetch.complete_bucket(handle, dtypes)
    assert handle.complete and work.work.waits == 1
    for p, want, dtype in zip(params, expected, dtypes):
        assert p.ds_status is Status.AVAILABLE
        assert p.data.dtype == dtype and p.data.shape == p.ds_shape and p.data.is_contiguous()
        assert torch.equal(p.data, want)
        # the quantization error is int8 rounding of the true values
        assert torch.allclose(p.data.float(), p.full.view(p.ds_shape).float(), rtol=0.02, atol=0.1)
    # every parameter owns its memory: releasing one frees it, as upstream's per-parameter concatenations
    pointers = {p.data.untyped_storage().data_ptr() for p in params}
    assert len(pointers) == len(params)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("ranks", [1, 3, 8])
def test_single_completion_is_upstreams_wait(dtype, ranks):
    param = _param((37, 11), dtype, ranks)
    received, layout, _ = _gathered([param], ranks, dtype)
    work = fetch.PacketGather(Work(), received, layout)
    handle = SimpleNamespace(_AllGatherHandle__param=param)
    expected, = _upstream([param], received, layout, ranks, [dtype])
    fetch.complete_single(handle, work)
    assert handle._AllGatherHandle__complete and param.ds_status is Status.AVAILABLE
    assert param.data.dtype == dtype and torch.equal(param.data, expected)
