"""qgZ's block layout and three codec steps (pure torch), all ranks simulated in one process."""
import pytest
import torch

from deepspeed_zeropp.backends import torch_ref
from deepspeed_zeropp.formats.dtypes import BY_NAME as DTYPES
from deepspeed_zeropp.formats.int4 import GROUP, LEVELS, STEP, block_bytes
from tests.qgz_sim import bound_of_largest, geometry, reduce_scatter

TOPOLOGIES = [(2, 1), (3, 1), (4, 2), (6, 2), (8, 4)]  # (world, local_size)


def exactly_representable(world, local_size, numel, dtype, seed):
    """Gradients whose every 4-bit rounding is exact: one rank per node (local index node % local_size) is non-zero,
    so node sums are one rank's values; values are integers in [-7, 7] times a power of two per rank, and every
    group starts with +-7 (absmax 7 * 2^k, multiplier a power of two, codes the integers themselves). Returns the
    gradients and each one's values as the codec decodes them: (code * STEP) * 7 * 2^k, which is not the code times
    2^k for codes +-3 and +-6."""
    chunk, _ = geometry(numel, world)
    position = torch.arange(numel)
    gen = torch.Generator().manual_seed(seed)
    gradients, decoded = [], []
    for rank in range(world):
        values = torch.randint(-LEVELS, LEVELS + 1, (numel, ), generator=gen).float()
        starts = (position % chunk) % GROUP == 0
        values[starts] = torch.where(torch.rand(numel, generator=gen) < 0.5, -7.0, 7.0)[starts]
        node, local = divmod(rank, local_size)
        weight = 2.0**(rank % 3 - 1) * (local == node % local_size)
        gradients.append((values * weight).to(dtype))
        decoded.append((values * STEP) * 7.0 * weight)
    return gradients, decoded


@pytest.mark.parametrize("world,local_size", TOPOLOGIES)
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("numel", [1, 255, 1000, 3 * 257 * 8 + 5])
def test_layout_is_exact_when_the_rounding_is(world, local_size, dtype, numel):
    """Every value lands in its owner's partition exactly: a misplaced row, chunk or nibble cannot pass. The decoded
    values are summed in fp32, then multiplied by 1 / world as an fp32 value and rounded once to the dtype."""
    gradients, decoded = exactly_representable(world, local_size, numel, dtype, seed=numel)
    results = reduce_scatter(gradients, local_size, torch_ref)
    total = decoded[0].clone()
    for values in decoded[1:]:  # fp32, in rank order as the codec sums (the zeros of non-carriers add exactly)
        total += values
    mean = (total * torch.tensor(1.0 / world, dtype=torch.float32)).to(dtype)
    chunk, _ = geometry(numel, world)
    for rank, result in enumerate(results):
        expected = mean[rank * chunk:(rank + 1) * chunk]
        assert result.dtype == dtype and result.shape == expected.shape
        assert torch.equal(result, expected), rank


@pytest.mark.parametrize("world,local_size", TOPOLOGIES)
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
def test_random_gradients_within_the_4bit_bound(world, local_size, dtype):
    gen = torch.Generator().manual_seed(world)
    gradients = [(torch.randn(3 * 1000 + 7, generator=gen)).to(dtype) for _ in range(world)]
    results = reduce_scatter(gradients, local_size, torch_ref)
    mean = torch.stack([g.double() for g in gradients]).mean(0)
    largest = max(g.double().abs().max() for g in gradients)
    got = torch.cat(results).double()
    assert got.shape == mean.shape
    rounding = torch.finfo(dtype).eps * mean.abs()  # the final rounding to the dtype
    assert ((got - mean).abs() - rounding).max() <= largest * bound_of_largest(local_size)
    assert ((got - mean).pow(2).mean() / mean.pow(2).mean()).sqrt() < 0.2


@pytest.mark.parametrize("world,local_size", [(2, 1), (4, 1), (4, 2), (8, 2), (8, 4)])
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
def test_constant_gradients_reduce_exactly(world, local_size, dtype):
    """A constant gradient per rank is a group of equal values at every stage, which 4-bit rounding keeps exactly
    (codes [-8, 7] for the multiplier 8 / absmax would clamp +absmax: 1.0 from every rank would reduce to 0.875
    through one stage and 0.766 through two). The constants' sums are exact, so the mean is too."""
    constants = [1.0, 0.375, -2.5, 1.0, 6.0, -0.125, 1.0, 40.0][:world]
    gradients = [torch.full((4 * GROUP * world + 2 * world, ), c, dtype=dtype) for c in constants]
    results = torch.cat(reduce_scatter(gradients, local_size, torch_ref))
    assert torch.equal(results, torch.full_like(results, sum(constants) / world))
    ones = torch.cat(reduce_scatter([torch.ones(GROUP * world, dtype=dtype)] * world, local_size, torch_ref))
    assert torch.equal(ones, torch.ones_like(ones))


@pytest.mark.parametrize("world,local_size", [(2, 1), (4, 2)])
def test_reduce_scatter_is_unbiased(world, local_size):
    """The mean error over many random values is ~0 relative to the values' RMS (clamping each group's +absmax, as
    codes [-8, 7] for 8 / absmax do, would make it -1.7e-3 on 2 nodes and -4e-3 on 2x2; the noise here is ~3e-4)."""
    gen = torch.Generator().manual_seed(3)
    gradients = [torch.randn(1 << 18, generator=gen) for _ in range(world)]
    mean = torch.stack([g.double() for g in gradients]).mean(0)
    error = torch.cat(reduce_scatter(gradients, local_size, torch_ref)).double() - mean
    assert abs(error.mean().item()) / mean.pow(2).mean().sqrt().item() < 8e-4


@pytest.mark.parametrize("world,local_size", [(2, 1), (4, 2)])
def test_empty_gradient(world, local_size):
    results = reduce_scatter([torch.empty(0, dtype=torch.bfloat16)] * world, local_size, torch_ref)
    assert [(r.shape, r.dtype) for r in results] == [((0, ), torch.bfloat16)] * world


def test_non_finite_value_poisons_only_its_group():
    world, local_size, numel = 4, 2, 4 * 512
    gradients = [torch.randn(numel, dtype=torch.bfloat16) for _ in range(world)]
    gradients[1][512 + 300] = float("inf")  # chunk 1 (rank 1's), second group of that chunk
    results = reduce_scatter(gradients, local_size, torch_ref)
    assert results[1][256:].isnan().all() and torch.isfinite(results[1][:256]).all()
    for rank in (0, 2, 3):
        assert torch.isfinite(results[rank]).all()


def test_block_bytes_match_the_encoded_blocks():
    chunk, padded = geometry(1000, 4)
    blocks = torch_ref.qgz_encode(torch.randn(1000), 2, 2, chunk, padded)
    assert blocks.dtype == torch.uint8 and blocks.shape == (2, block_bytes(2, padded))
    assert block_bytes(2, padded) == 2 * padded // 2 + 2 * padded // GROUP * 4
