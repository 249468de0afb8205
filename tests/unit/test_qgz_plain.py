"""qgZ's unquantized path (1-D, odd-sized and empty gradients): this rank's chunk of the fp32 sum, times the mean's
factor, rounded once to each tensor's dtype, bit for bit against a per-tensor reference, for every way the call's
rows are built (one tensor filling them, several, padding); and the mean's factor as torch rounds 1 / world."""
import pytest
import torch

import deepspeed.comm
from deepspeed_zeropp import qgz

WORLD = 8


def _fake_reduce_scatter(world, rank):
    """Every rank holds this rank's values: rank ``rank``'s chunk of the sum, added in rank order in fp32."""

    def reduce_scatter_fn(output, flat):
        own = flat.view(world, -1)[rank]
        total = torch.zeros_like(own)
        for _ in range(world):
            total += own
        output.copy_(total)

    return reduce_scatter_fn


def _expected(tensor, world, rank, factor):
    chunk = -(-tensor.numel() // world)
    padded = torch.zeros(world * chunk, dtype=torch.float32)
    padded[:tensor.numel()] = tensor.reshape(-1).float()
    own = padded[rank * chunk:(rank + 1) * chunk]
    total = torch.zeros_like(own)
    for _ in range(world):
        total += own
    mine = min(max(tensor.numel() - rank * chunk, 0), chunk)
    return (total * factor).to(tensor.dtype)[:mine]


CASES = {
    "one bf16 filling the rows": [(torch.bfloat16, [64])],
    "one fp32 filling the rows": [(torch.float32, [8, 4])],
    "one fp16 padded": [(torch.float16, [13])],
    "several exact, mixed dtypes": [(torch.bfloat16, [16]), (torch.float32, [8]), (torch.float16, [24])],
    "several, some padded": [(torch.bfloat16, [16]), (torch.float32, [5]), (torch.bfloat16, [7, 3])],
    "empty and 0-d among them": [(torch.float32, [0]), (torch.bfloat16, []), (torch.float32, [9])],
}


def check_plain(case, rank, device, monkeypatch):
    """qgz.reduce_scatter_plain on ``device`` against the reference computed on the CPU (fp32 sums in one order,
    one product, one rounding: the same bits on either device); the gradients unchanged."""
    monkeypatch.setattr(deepspeed.comm, "reduce_scatter_fn", _fake_reduce_scatter(WORLD, rank), raising=False)
    gen = torch.Generator().manual_seed(rank)
    kept = [(torch.randn(shape, generator=gen) * 3).to(dtype) for dtype, shape in CASES[case]]
    tensors = [t.to(device) for t in kept]
    factor = qgz.mean_factor(WORLD)
    results = qgz.reduce_scatter_plain(tensors, WORLD, rank, factor)
    for tensor, before, result in zip(tensors, kept, results):
        expected = _expected(before, WORLD, rank, factor)
        assert result.device == tensor.device and result.dtype == tensor.dtype, (case, tensor.shape)
        assert torch.equal(result.cpu(), expected), (case, tensor.shape)
        assert torch.equal(tensor.cpu(), before)  # the gradients are read, never written


@pytest.mark.parametrize("rank", [0, WORLD - 1])
@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_plain_reduce_scatter_matches_the_reference(case, rank, monkeypatch):
    check_plain(case, rank, "cpu", monkeypatch)


def test_only_empty_tensors_send_nothing(monkeypatch):
    monkeypatch.setattr(deepspeed.comm, "reduce_scatter_fn", None, raising=False)  # a call would fail
    results = qgz.reduce_scatter_plain([torch.empty(0), torch.empty(0, 3, dtype=torch.bfloat16)], WORLD, 0, 0.125)
    assert [(r.numel(), r.dtype) for r in results] == [(0, torch.float32), (0, torch.bfloat16)]


@pytest.mark.parametrize("world", [1, 3, 7, 8, 48, 63, 64, 1000, 65537])
def test_mean_factor_is_torchs_fp32_rounding(world):
    assert qgz.mean_factor(world) == float(torch.tensor(1.0 / world, dtype=torch.float32))
