"""Init's coalesced gather of unquantized partitions in one all-gather (patching/seams/coalesced.py) against
DeepSpeed's one all-gather per parameter: the same values bit for bit, in every dtype, for padded partitions (a
partition of one element, sizes that are not multiples of the world), several runs of equal sizes and lists cut
into several all-gathers. The gathered buffer is built as the all-gather builds it: each rank's concatenation of
its partitions, in the order the seam sends them, rank after rank."""
import math
from types import SimpleNamespace

import pytest
import torch

from deepspeed_zeropp.patching.seams import coalesced
from tests.helpers import DTYPES


def _param(shape, dtype, world, seed):
    numel = math.prod(shape)
    part = -(-numel // world)
    generator = torch.Generator().manual_seed(seed)
    full = torch.randn(world * part, generator=generator).mul_(100).to(dtype)
    full[numel:] = 0  # DeepSpeed pads the last partitions with zeros
    return SimpleNamespace(full=full,
                           ds_numel=numel,
                           ds_shape=shape,
                           ds_tensor=SimpleNamespace(ds_numel=part, dtype=dtype),
                           data=torch.empty(0, dtype=dtype))


def _upstream(param, world):
    """DeepSpeed's per-parameter all-gather: rank r's partition at r * part, cut to ds_numel."""
    return param.full.narrow(0, 0, param.ds_numel).view(param.ds_shape)


def _gathered(chunk, world):
    part = lambda p, r: p.full.narrow(0, r * p.ds_tensor.ds_numel, p.ds_tensor.ds_numel)
    return torch.cat([torch.cat([part(p, r) for p in chunk]) for r in range(world)])


SHAPES = [(256, ), (1, ), (3, ), (2, 256), (131, ), (256, ), (1024, ), (7, 3), (256, )]


@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("world", [2, 3, 8])
def test_assign_is_upstream_bit_for_bit(dtype, world):
    params = [_param(shape, DTYPES[dtype], world, seed) for seed, shape in enumerate(SHAPES)]
    chunk = next(coalesced.chunks(params, world))
    assert len(chunk) == len(params)
    assert [p.ds_tensor.ds_numel for p in chunk] == sorted(p.ds_tensor.ds_numel for p in params)
    coalesced.assign(chunk, _gathered(chunk, world), world)
    for param in params:
        expected = _upstream(param, world)
        assert param.data.dtype == expected.dtype and param.data.shape == expected.shape
        assert param.data.is_contiguous()
        assert torch.equal(param.data.view(torch.uint8), expected.contiguous().view(torch.uint8))


def test_lists_are_cut_at_the_bound(monkeypatch):
    """A bound of 8 gathered elements at 2 ranks: lists of [1, 2] and [2] elements per rank, and a partition above
    the bound (6 per rank, 12 gathered) on its own; every value lands where upstream's does."""
    monkeypatch.setattr(coalesced, "MAX_GATHERED_NUMEL", 8)
    world = 2
    params = [_param(shape, torch.bfloat16, world, seed) for seed, shape in enumerate([(4, ), (3, ), (12, ), (2, )])]
    chunks = list(coalesced.chunks(params, world))
    assert [[p.ds_tensor.ds_numel for p in chunk] for chunk in chunks] == [[1, 2], [2], [6]]
    for chunk in chunks:
        coalesced.assign(chunk, _gathered(chunk, world), world)
    for param in params:
        assert torch.equal(param.data, _upstream(param, world))


def test_a_whole_buffer_is_not_copied():
    """One partition filling its all-gather: the parameter's data is the gathered buffer itself."""
    world = 4
    param = _param((64, ), torch.float32, world, 0)
    gathered = _gathered([param], world)
    coalesced.assign([param], gathered, world)
    assert param.data.data_ptr() == gathered.data_ptr() and torch.equal(param.data, _upstream(param, world))
