"""qgZ's CUDA kernels (csrc/qgz.cu) against the pure-torch backend (torch_ref) on the CPU, bit for bit: each step on
its own, then whole reduce-scatters of every rank simulated in one process."""
import math

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

from deepspeed_zeropp.backends import cuda as cuda_backend  # noqa: E402
from deepspeed_zeropp.backends import torch_ref  # noqa: E402
from deepspeed_zeropp.formats.int4 import GROUP  # noqa: E402
from tests.gpu.test_kernels import assert_bitwise, extension_builds  # noqa: E402,F401
from tests.qgz_sim import geometry, reduce_scatter  # noqa: E402

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
# (world, local_size): one rank per node (no node-local stage), and 2-8 ranks per node.
TOPOLOGIES = [(2, 1), (3, 1), (4, 2), (6, 3), (16, 8)]
# Chunk sizes: below one group, not a multiple of 8 values (element-wise loads), a multiple of 8 (16-byte loads),
# whole groups, and the 4096 x 4096 gradient of the benchmark split 16 ways.
NUMELS = [1, 100, 3 * 1001, 8 * 999 * 2, 16 * 4 * GROUP, 4096 * 4096]


def gradient(numel, dtype, seed, scale=1.0):
    """Normal values whose 1024-value stretches span six decades (within fp16's range unless scaled)."""
    gen = torch.Generator().manual_seed(seed)
    stretches = math.ceil(numel / 1024)
    magnitude = 10.0**(torch.rand(stretches, 1, generator=gen, dtype=torch.float64) * 6 - 3)
    values = (torch.randn(stretches, 1024, generator=gen, dtype=torch.float64) * magnitude).view(-1)[:numel]
    return (values * scale).to(dtype)


def edge_gradient(dtype):
    """One 256-value group per edge case: zeros, tiny, subnormal (bf16/fp32: absmax below MIN_SCALE), the dtype's
    max, inf, NaN, exact .5 ties, one value among zeros, a constant, +-c."""
    info = torch.finfo(dtype)
    gen = torch.Generator().manual_seed(5)
    noise = lambda: torch.randn(GROUP, generator=gen, dtype=torch.float64)  # noqa: E731
    ramp = torch.arange(GROUP, dtype=torch.float64)
    cases = [
        torch.zeros(GROUP, dtype=torch.float64),
        noise() * 1e-30,
        noise() * info.tiny / 2,
        torch.where(ramp % 3 == 0, info.max, -info.max * torch.rand(GROUP, generator=gen, dtype=torch.float64)),
        torch.where(ramp == 7, math.inf, noise()),
        torch.where(ramp == 0, math.nan, noise()),
        torch.where(ramp == 0, 7.0, (ramp % 11) - 5.5),  # multiplier 1: .5 ties round half to even
        torch.where(ramp == 100, -3.25, 0.0),
        torch.full((GROUP, ), 0.3, dtype=torch.float64),  # decodes exactly: code 7 is the scale itself
        torch.where(ramp % 3 == 0, -1e-3, 1e-3),
    ]
    return torch.cat(cases).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("numel", NUMELS)
@pytest.mark.parametrize("world,local_size", TOPOLOGIES)
def test_encode_matches_reference(world, local_size, numel, dtype):
    nodes = world // local_size
    x = gradient(numel, dtype, seed=numel + world)
    chunk, padded = geometry(numel, world)
    for destinations, rows in ((local_size, nodes), (world, 1)):
        blocks = cuda_backend.qgz_encode(x.cuda(), destinations, rows, chunk, padded)
        assert_bitwise(blocks, torch_ref.qgz_encode(x, destinations, rows, chunk, padded))


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
def test_edge_values_and_misaligned_input_match_reference(dtype):
    x = edge_gradient(dtype)
    chunk, padded = geometry(x.numel(), 2)
    blocks = cuda_backend.qgz_encode(x.cuda(), 2, 1, chunk, padded)
    assert_bitwise(blocks, torch_ref.qgz_encode(x, 2, 1, chunk, padded))
    scales = blocks[:, padded // 2:].contiguous().view(torch.float32).cpu()
    assert torch.isnan(scales).tolist() == [[False] * 4 + [True], [True] + [False] * 4]
    base = torch.cat([x[:1], x]).cuda()
    misaligned = base[1:]  # 2 or 4 bytes past a 16-byte boundary: element-wise loads everywhere
    assert_bitwise(cuda_backend.qgz_encode(misaligned, 2, 1, chunk, padded), blocks)


def received_blocks(sources, rows, padded, dtype, seed):
    """What a rank receives in an all-to-all: each source's encoded block (torch codec, CPU)."""
    chunk = padded - 3
    blocks = []
    for source in range(sources):
        x = gradient(rows * chunk, dtype, seed=seed + source, scale=1e3 if dtype != torch.float16 else 1.0)
        blocks.append(torch_ref.qgz_encode(x, 1, rows, chunk, padded)[0])
    return torch.stack(blocks)


@pytest.mark.parametrize("sources,rows,padded", [(1, 2, GROUP), (2, 2, 4 * GROUP), (8, 2, 1024 * GROUP),
                                                 (3, 5, 7 * GROUP)])
def test_reduce_encode_matches_reference(sources, rows, padded):
    received = received_blocks(sources, rows, padded, torch.bfloat16, seed=sources)
    received[-1, :padded // 2] = 0x77  # codes 7 everywhere in the first row: its sums' extremes reach code +-7
    assert_bitwise(cuda_backend.qgz_reduce_encode(received.cuda(), rows, padded),
                   torch_ref.qgz_reduce_encode(received, rows, padded))


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("sources,padded,count", [(1, GROUP, 1), (2, 4 * GROUP, 1000), (3, 7 * GROUP, 7 * GROUP),
                                                  (8, 64 * GROUP, 64 * GROUP - 5), (2, GROUP, 0)])
def test_decode_sum_matches_reference(dtype, sources, padded, count):
    received = received_blocks(sources, 1, padded, torch.float32, seed=count)
    factor = float(torch.tensor(1 / 3, dtype=torch.float32))
    out = cuda_backend.qgz_decode_sum(received.cuda(), padded, count, factor, dtype)
    assert out.shape == (count, ) and out.dtype == dtype
    assert_bitwise(out, torch_ref.qgz_decode_sum(received, padded, count, factor, dtype))


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("world,local_size", TOPOLOGIES)
def test_whole_reduce_scatter_matches_reference(world, local_size, dtype):
    numel = 3 * 4096 + 17
    gradients = [
        gradient(numel, dtype, seed=rank, scale=1.0 if dtype == torch.float16 else 1e6) for rank in range(world)
    ]
    ours = reduce_scatter([g.cuda() for g in gradients], local_size, cuda_backend)
    reference = reduce_scatter(gradients, local_size, torch_ref)
    for got, expected in zip(ours, reference):
        assert_bitwise(got, expected)
    assert all(torch.isfinite(r).all() for r in ours)


def test_bad_geometry_is_refused_with_the_reason():
    """Bad arguments raise ValueError naming the argument, before any launch on bad memory."""
    x = torch.randn(1000, device="cuda")
    with pytest.raises(ValueError, match="padded_chunk must be a non-negative multiple of 256"):
        cuda_backend.qgz_encode(x, 2, 1, 500, 500)
    with pytest.raises(ValueError, match="do not cover the input"):
        cuda_backend.qgz_encode(x, 2, 1, 256, 256)
    with pytest.raises(ValueError,
                       match="must be one of torch.float16, torch.bfloat16, torch.float32, got torch.float64"):
        cuda_backend.qgz_encode(x.double(), 2, 1, 500, 512)
    blocks = cuda_backend.qgz_encode(x, 2, 1, 500, 512)
    with pytest.raises(ValueError, match="bytes per source, expected"):
        cuda_backend.qgz_reduce_encode(blocks, 2, 512)
