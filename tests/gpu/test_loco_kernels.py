"""LoCo's CUDA kernels (error feedback in csrc/qgz.cu) against the pure-torch backend (torch_ref) on the CPU, bit for
bit: the blocks and the updated error buffers of each step, over several calls, then whole reduce-scatters of
every rank simulated in one process."""
import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

from deepspeed_zeropp.backends import cuda as cuda_backend  # noqa: E402
from deepspeed_zeropp.backends import torch_ref  # noqa: E402
from deepspeed_zeropp.formats.int4 import GROUP, Feedback, weights  # noqa: E402
from tests.helpers import DTYPES, assert_bitwise, extension_builds  # noqa: E402,F401
from tests.loco_sim import feedbacks  # noqa: E402
from tests.qgz_sim import edge_gradient, geometry, gradient, received_blocks, reduce_scatter  # noqa: E402

TOPOLOGIES = [(2, 1), (3, 1), (4, 2), (6, 3), (16, 8)]
NUMELS = [1, 100, 3 * 1001, 8 * 999 * 2, 16 * 4 * GROUP]
BETAS = [0.8, 0.0, 0.37]


def twin(error, err_beta):
    """The same error buffer on the CPU (for the reference) and on the GPU (for the kernels)."""
    beta, keep = weights(err_beta)
    return Feedback(error.clone(), beta, keep), Feedback(error.clone().cuda(), beta, keep)


def initial_error(values, seed, scale=1e-2):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(values, generator=gen) * scale


@pytest.mark.parametrize("err_beta", BETAS)
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("numel", NUMELS)
@pytest.mark.parametrize("world,local_size", TOPOLOGIES)
def test_encode_with_feedback_matches_reference(world, local_size, numel, dtype, err_beta):
    """Both shapes the reduce-scatter encodes (node-local: L destinations of `nodes` rows; one rank per node: world
    destinations of one row), three calls in a row on one buffer: blocks and errors equal after every call."""
    nodes = world // local_size
    chunk, padded = geometry(numel, world)
    for destinations, rows in ((local_size, nodes), (world, 1)):
        reference, ours = twin(initial_error(destinations * rows * padded, seed=numel), err_beta)
        for call in range(3):
            x = gradient(numel, dtype, seed=numel + world + call)
            blocks = cuda_backend.qgz_encode(x.cuda(), destinations, rows, chunk, padded, ours)
            assert_bitwise(blocks, torch_ref.qgz_encode(x, destinations, rows, chunk, padded, reference))
            assert_bitwise(ours.error, reference.error)


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
def test_edge_values_and_misaligned_input_match_reference(dtype):
    """Edge groups (zeros, subnormal, the dtype's max, inf, NaN, ties, constants) and an error that overflows its
    group's compensated values: non-finite groups send NaN and reset their errors to 0, as the reference."""
    x = edge_gradient(dtype)
    chunk, padded = geometry(x.numel(), 2)
    error = initial_error(2 * padded, seed=3)
    error[3 * GROUP:4 * GROUP] = 3e38  # group 3 holds the dtype's max: bf16/fp32 values overflow to inf
    reference, ours = twin(error, 0.8)
    misaligned = Feedback(error.clone().cuda(), *weights(0.8))
    blocks = cuda_backend.qgz_encode(x.cuda(), 2, 1, chunk, padded, ours)
    assert_bitwise(blocks, torch_ref.qgz_encode(x, 2, 1, chunk, padded, reference))
    assert_bitwise(ours.error, reference.error)
    assert reference.error[4 * GROUP:6 * GROUP].eq(0).all()  # the inf and NaN groups
    base = torch.cat([x[:1], x]).cuda()
    assert_bitwise(cuda_backend.qgz_encode(base[1:], 2, 1, chunk, padded, misaligned), blocks)
    assert_bitwise(misaligned.error, ours.error)


@pytest.mark.parametrize("err_beta", BETAS)
@pytest.mark.parametrize("sources,rows,padded", [(1, 2, GROUP), (2, 2, 4 * GROUP), (8, 2, 1024 * GROUP),
                                                 (3, 5, 7 * GROUP)])
def test_reduce_encode_with_feedback_matches_reference(sources, rows, padded, err_beta):
    reference, ours = twin(initial_error(rows * padded, seed=sources, scale=10.0), err_beta)
    for call in range(3):
        received = received_blocks(sources, rows, padded, torch.bfloat16, seed=sources + 10 * call)
        received[-1, :padded // 2] = 0x77  # codes 7 everywhere in the first row: its sums' extremes reach code +-7
        assert_bitwise(cuda_backend.qgz_reduce_encode(received.cuda(), rows, padded, ours),
                       torch_ref.qgz_reduce_encode(received, rows, padded, reference))
        assert_bitwise(ours.error, reference.error)


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("world,local_size", TOPOLOGIES)
def test_whole_reduce_scatter_with_feedback_matches_reference(world, local_size, dtype):
    """Three reduce-scatters in a row with LoCo's buffers (tests/loco_sim.py sizes them as the patch does): every
    rank's result and every error buffer equal after each call."""
    numel = 3 * 4096 + 17
    reference = feedbacks(numel, world, local_size, 0.8)
    ours = feedbacks(numel, world, local_size, 0.8, device="cuda")
    for call in range(3):
        gradients = [
            gradient(numel, dtype, seed=100 * call + rank, scale=1.0 if dtype == torch.float16 else 1e6)
            for rank in range(world)
        ]
        got = reduce_scatter([g.cuda() for g in gradients], local_size, cuda_backend, ours)
        expected = reduce_scatter(gradients, local_size, torch_ref, reference)
        for a, b in zip(got, expected):
            assert_bitwise(a, b)
        for pair, reference_pair in zip(ours, reference):
            for fb, reference_fb in zip(pair, reference_pair):
                if reference_fb is None:
                    assert fb is None
                else:
                    assert_bitwise(fb.error, reference_fb.error)
    assert all(torch.isfinite(r).all() for r in got)


def test_bad_error_buffer_is_refused_with_the_reason():
    x = torch.randn(1000, device="cuda")
    beta, keep = weights(0.8)
    good = torch.zeros(2 * 512, device="cuda")
    with pytest.raises(ValueError, match="the error buffer holds 1000 values, expected 1024"):
        cuda_backend.qgz_encode(x, 2, 1, 500, 512, Feedback(good[:1000], beta, keep))
    with pytest.raises(ValueError, match="the error buffer must be a flat contiguous float32 tensor"):
        cuda_backend.qgz_encode(x, 2, 1, 500, 512, Feedback(good.half(), beta, keep))
    with pytest.raises(ValueError, match="the error buffer must be a flat contiguous float32 tensor"):
        cuda_backend.qgz_encode(x, 2, 1, 500, 512, Feedback(good.cpu(), beta, keep))
    with pytest.raises(ValueError, match="16-byte aligned"):
        cuda_backend.qgz_encode(x, 2, 1, 500, 512, Feedback(torch.zeros(1025, device="cuda")[1:], beta, keep))
    blocks = cuda_backend.qgz_encode(x, 2, 1, 500, 512)
    with pytest.raises(ValueError, match="the error buffer holds 1024 values, expected 512"):
        cuda_backend.qgz_reduce_encode(blocks[:1].contiguous(), 1, 512, Feedback(good, beta, keep))
