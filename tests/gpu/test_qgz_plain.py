"""qgZ's unquantized path on a CUDA device (its factor and rounding in one kernel per dtype there) against the CPU
reference of tests/unit/test_qgz_plain.py, bit for bit."""
import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

from tests.unit.test_qgz_plain import CASES, WORLD, check_plain  # noqa: E402


@pytest.mark.parametrize("rank", [0, WORLD - 1])
@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_plain_reduce_scatter_on_cuda_matches_the_reference(case, rank, monkeypatch):
    check_plain(case, rank, "cuda", monkeypatch)
