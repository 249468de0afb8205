"""qgZ's CUDA kernels (csrc/qgz.cu) against the pure-torch backend (torch_ref) on the CPU, bit for bit: each step on
its own, then whole reduce-scatters of every rank simulated in one process."""
import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

from deepspeed_zeropp.backends import cuda as cuda_backend  # noqa: E402
from deepspeed_zeropp.backends import torch_ref  # noqa: E402
from deepspeed_zeropp.formats.int4 import GROUP  # noqa: E402
from tests.helpers import DTYPES, assert_bitwise, extension_builds  # noqa: E402,F401
from tests.qgz_sim import edge_gradient, geometry, gradient, received_blocks, reduce_scatter  # noqa: E402

# (world, local_size): one rank per node (no node-local stage), and 2-8 ranks per node.
TOPOLOGIES = [(2, 1), (3, 1), (4, 2), (6, 3), (16, 8)]
# Chunk sizes: below one group, not a multiple of 8 values (element-wise loads), a multiple of 8 (16-byte loads),
# whole groups, and the 4096 x 4096 gradient of the benchmark split 16 ways.
NUMELS = [1, 100, 3 * 1001, 8 * 999 * 2, 16 * 4 * GROUP, 4096 * 4096]


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
