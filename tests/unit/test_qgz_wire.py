"""qgZ's block layout and three codec steps (pure torch), all ranks simulated in one process."""
import pytest
import torch

from deepspeed_zeropp.backends import torch_ref
from deepspeed_zeropp.qgz_wire import GROUP, block_bytes
from tests.qgz_sim import geometry, reduce_scatter

TOPOLOGIES = [(2, 1), (3, 1), (4, 2), (6, 2), (8, 4)]  # (world, local_size)
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


def exactly_representable(world, local_size, numel, dtype, seed):
    """Gradients whose every 4-bit rounding is exact: one rank per node (local index node % local_size) is non-zero,
    so node sums are one rank's values; values are integers in [-7, 7] times a power of two per rank, and every
    group starts with -8 (absmax 8 * 2^k, multiplier a power of two)."""
    chunk, _ = geometry(numel, world)
    position = torch.arange(numel)
    gen = torch.Generator().manual_seed(seed)
    gradients = []
    for rank in range(world):
        values = torch.randint(-7, 8, (numel, ), generator=gen).double()
        values[(position % chunk) % GROUP == 0] = -8
        node, local = divmod(rank, local_size)
        carrier = local == node % local_size
        gradients.append((values * 2.0**(rank % 3 - 1) * carrier).to(dtype))
    return gradients


@pytest.mark.parametrize("world,local_size", TOPOLOGIES)
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("numel", [1, 255, 1000, 3 * 257 * 8 + 5])
def test_layout_is_exact_when_the_rounding_is(world, local_size, dtype, numel):
    """Every value lands in its owner's partition exactly: a misplaced row, chunk or nibble cannot pass. The sum is
    exact, then multiplied by 1 / world as an fp32 value and rounded once to the gradient's dtype."""
    gradients = exactly_representable(world, local_size, numel, dtype, seed=numel)
    results = reduce_scatter(gradients, local_size, torch_ref)
    total = torch.stack([g.double() for g in gradients]).sum(0).float()
    mean = (total * torch.tensor(1.0 / world, dtype=torch.float32)).to(dtype)
    chunk, _ = geometry(numel, world)
    for rank, result in enumerate(results):
        expected = mean[rank * chunk:(rank + 1) * chunk]
        assert result.dtype == dtype and result.shape == expected.shape
        assert torch.equal(result, expected), rank


@pytest.mark.parametrize("world,local_size", TOPOLOGIES)
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
def test_random_gradients_within_the_4bit_bound(world, local_size, dtype):
    """Each 4-bit rounding errs by half a step (absmax / 16) of what it rounds, clamping +absmax by a whole step
    (absmax / 8); two stages, each at most ``world`` times the largest value, bound the mean's error by 1/4 of the
    largest gradient value."""
    gen = torch.Generator().manual_seed(world)
    gradients = [(torch.randn(3 * 1000 + 7, generator=gen)).to(dtype) for _ in range(world)]
    results = reduce_scatter(gradients, local_size, torch_ref)
    mean = torch.stack([g.double() for g in gradients]).mean(0)
    largest = max(g.double().abs().max() for g in gradients)
    got = torch.cat(results).double()
    assert got.shape == mean.shape
    assert (got - mean).abs().max() <= largest / 4
    assert ((got - mean).pow(2).mean() / mean.pow(2).mean()).sqrt() < 0.2


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
