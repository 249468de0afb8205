"""LoCo (qgZ with error feedback): the feedback step against a naive per-element reference (numpy float32, exact),
the property it exists for (the running mean of reduced gradients converges to the exact mean; without feedback
it does not), and the error buffers' contract with DeepSpeed's stage 3 (reset_T, loss-scale rescale, overflow)."""
import types

import numpy as np
import pytest
import torch

from deepspeed_zeropp import loco
from deepspeed_zeropp.backends import torch_ref
from deepspeed_zeropp.formats.int4 import GROUP, MIN_SCALE, Feedback, dequantize_int4, weights
from tests.loco_sim import running_mean_error
from tests.qgz_sim import bound_of_largest, geometry


def naive_feedback(values, error, beta, keep):
    """One stage with error feedback, element by element in numpy float32 (no fused multiply-add)."""
    decoded = np.zeros_like(values)
    updated = np.zeros_like(error)
    step = np.float32(1) / np.float32(7)
    for start in range(0, values.size, GROUP):
        group = slice(start, start + GROUP)
        v = values[group] + error[group]
        absmax = np.abs(v).max()
        if not np.isfinite(absmax):
            decoded[group] = np.nan
            continue  # errors of a non-finite group are reset to 0
        scale = max(absmax, np.float32(MIN_SCALE))
        codes = np.clip(np.rint(v * (np.float32(7) / scale)), -7, 7).astype(np.float32)
        decoded[group] = (codes * step) * scale
        updated[group] = np.float32(beta) * error[group] + np.float32(keep) * (v - decoded[group])
    return decoded, updated


@pytest.mark.parametrize("err_beta", [0.0, 0.8, 0.3, 1.0])
def test_encode_with_feedback_matches_naive(err_beta):
    """Two destinations of one row, a chunk that is not whole groups (padding), an inf in one group: the blocks
    decode to the naive values and the error buffer holds the naive errors, bit for bit."""
    gen = torch.Generator().manual_seed(1)
    numel = 2 * (3 * GROUP - 40)
    x = (torch.randn(numel, generator=gen) * 10.0**torch.randint(-3, 3, (numel, ), generator=gen)).to(torch.bfloat16)
    x[GROUP + 5] = float("inf")
    chunk, padded = geometry(numel, 2)
    error = torch.randn(2 * padded, generator=gen) * 0.01
    beta, keep = weights(err_beta)
    values = torch.zeros(2, padded)
    values[:, :chunk] = x.float().view(2, chunk)
    expected_decoded, expected_error = naive_feedback(values.view(-1).numpy(), error.numpy(), beta, keep)
    blocks = torch_ref.qgz_encode(x, 2, 1, chunk, padded, Feedback(error, beta, keep))
    decoded = dequantize_int4(blocks[:, :padded // 2].reshape(-1),
                              blocks[:, padded // 2:].reshape(-1).view(torch.float32))
    assert torch.equal(decoded.isnan(), torch.from_numpy(np.isnan(expected_decoded)))
    assert torch.equal(decoded.nan_to_num(), torch.from_numpy(expected_decoded).nan_to_num())
    assert torch.equal(error, torch.from_numpy(expected_error))
    assert error[GROUP:2 * GROUP].eq(0).all() and error[padded - GROUP:padded].ne(0).any()


def test_feedback_of_beta_one_is_no_feedback():
    """err_beta = 1 keeps the (zero) error: plain qgZ, bit for bit."""
    x = torch.randn(4 * GROUP)
    error = torch.zeros(4 * GROUP)
    with_buffer = torch_ref.qgz_encode(x, 2, 1, 2 * GROUP, 2 * GROUP, Feedback(error, *weights(1.0)))
    assert torch.equal(with_buffer, torch_ref.qgz_encode(x, 2, 1, 2 * GROUP, 2 * GROUP)) and error.eq(0).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("drift", [0.0, 2e-3], ids=["constant", "drifting"])
@pytest.mark.parametrize("world,local_size", [(2, 1), (4, 2)], ids=["2x1", "2x2"])
def test_running_mean_converges_with_feedback_only(world, local_size, drift, dtype):
    """Gradients whose small values (1-6 % of their group's largest) 4-bit qgZ rounds to 0 on every call: the
    running mean of the reduced gradient misses them by up to 6 % of the largest value. With feedback it converges
    to the exact mean (rounded to the dtype): every stage's carried error is at most half its step, so after T
    calls the mean is off by at most the sum of those half steps (``bound_of_largest``) over (1 - beta) T, widened
    by 20 % for the carried error's own share of the scale, plus half an ulp of the dtype for the final rounding."""
    steps, err_beta = 48, 0.8
    args = dict(world=world, local_size=local_size, dtype=dtype, steps=steps, drift=drift, numel=2 * world * GROUP)
    without = running_mean_error(**args)
    with_feedback = running_mean_error(**args, err_beta=err_beta)
    bound = 1.2 * bound_of_largest(local_size) / ((1 - err_beta) * steps) + torch.finfo(dtype).eps / 2
    assert without > 0.04, without
    assert with_feedback <= bound < without / 2, (with_feedback, bound, without)


def test_reset_t_clears_the_buffers_after_that_many_reductions():
    param = torch.nn.Parameter(torch.zeros(8, 64))
    sizes = (4 * GROUP, 2 * GROUP)
    seen = []
    for call in range(7):
        intra, inter = loco._buffers(param, sizes, torch.device("cpu"), reset_t=3)
        seen.append((param.intra_ef_buf[0], intra.abs().sum().item()))
        intra.fill_(call + 1.0)
        inter.fill_(call + 1.0)
        assert param.intra_ef_buf[1] is intra and param.inter_ef_buf[1] is inter and intra.dtype == torch.float32
    # uses counted 1, 2, 3, then fresh zeros on the 4th and 7th call
    assert seen == [(1, 0.0), (2, GROUP * 4.0), (3, GROUP * 8.0), (1, 0.0), (2, GROUP * 16.0), (3, GROUP * 20.0),
                    (1, 0.0)]


def _stage3_buffer_update():
    """DeepSpeed's DeepSpeedZeroOptimizer_Stage3._loco_err_buf_update on releases with LoCo; else its documented
    effect (index 1 of both buffers times the loss-scale ratio; both deleted after an overflow)."""
    from deepspeed.runtime.zero import stage3
    upstream = getattr(stage3.DeepSpeedZeroOptimizer_Stage3, "_loco_err_buf_update", None)
    if upstream is not None:
        return upstream

    def documented(self, overflow, scale=1.0):
        for group in self.fp16_groups:
            for p in group:
                if hasattr(p, "intra_ef_buf"):
                    if overflow:
                        del p.intra_ef_buf, p.inter_ef_buf
                    else:
                        p.intra_ef_buf[1] *= scale
                        p.inter_ef_buf[1] *= scale

    return documented


def test_stage3_rescales_and_drops_the_buffers(monkeypatch):
    """The optimizer multiplies index 1 of each buffer in place when the loss scale changes, and deletes both
    after an overflow: here index 1 is the fp32 error itself, so it is rescaled exactly, and the next reduction
    starts from zeros."""
    from deepspeed.runtime.zero import stage3
    monkeypatch.setattr(stage3.dist, "get_rank", lambda *args, **kwargs: 1)
    update = _stage3_buffer_update()
    param = torch.nn.Parameter(torch.zeros(8, 64))
    optimizer = types.SimpleNamespace(fp16_groups=[[param]])
    sizes = (4 * GROUP, 2 * GROUP)
    intra, inter = loco._buffers(param, sizes, torch.device("cpu"), reset_t=100)
    intra.fill_(3.0)
    inter.fill_(-5.0)
    update(optimizer, False, 0.5)
    assert param.intra_ef_buf[1] is intra and intra.eq(1.5).all() and inter.eq(-2.5).all()
    update(optimizer, True, 0.5)
    assert not hasattr(param, "intra_ef_buf") and not hasattr(param, "inter_ef_buf")
    intra, inter = loco._buffers(param, sizes, torch.device("cpu"), reset_t=100)
    assert intra.eq(0).all() and inter.eq(0).all() and param.intra_ef_buf[0] == 1


def test_error_sizes_follow_the_stages():
    """One fp32 error per value each stage quantizes: every rank's padded chunk at the first stage, the node sums'
    rows at the second (none with one rank per node)."""
    chunk, padded = geometry(1000, 4)
    assert loco.error_sizes(1000, 4, 2) == (4 * padded, 2 * padded)
    assert loco.error_sizes(1000, 4, 1) == (4 * padded, 0)


def test_loco_param_defaults_and_bad_values():
    assert loco.parse_loco_param(None) == (*weights(0.8), 1024)
    assert loco.parse_loco_param({"err_beta": 0.5, "reset_T": 8}) == (0.5, 0.5, 8)
    with pytest.raises(TypeError, match="loco_param .* must be a dict"):
        loco.parse_loco_param([0.8, 1024])
    with pytest.raises(ValueError, match=r"unknown keys \['err_Beta'\]; accepted: err_beta, reset_T"):
        loco.parse_loco_param({"err_Beta": 0.8})
    with pytest.raises(ValueError, match=r"err_beta'\] must be a number in \[0, 1\], got 1.5"):
        loco.parse_loco_param({"err_beta": 1.5})
    with pytest.raises(ValueError, match=r"reset_T'\] must be an integer >= 1, got 0"):
        loco.parse_loco_param({"reset_T": 0})
