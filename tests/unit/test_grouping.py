"""Group counts: identical to DeepSpeed's own heuristic wherever it succeeds, a divisor of numel elsewhere."""
import pytest
import torch

from deepspeed_zeropp.grouping import group_count


class RecordingOp:
    """Stands in for the compiled op so DeepSpeed's own (unpatched) CUDAQuantizer.quantize can be run on CPU."""
    Symmetric = 0

    def quantize(self, x, groups, bits, kind):
        self.groups = groups
        return x, None


@pytest.fixture
def upstream_groups():
    from deepspeed.runtime.zero.partition_parameters import CUDAQuantizer
    quantizer = CUDAQuantizer.__new__(CUDAQuantizer)
    quantizer.quantizer_cuda_module = RecordingOp()
    quantizer.group_size_cache = {}

    def groups(numel):
        CUDAQuantizer.quantize(quantizer, torch.zeros(numel, dtype=torch.float16))
        return quantizer.quantizer_cuda_module.groups

    return groups


SIZES = [
    8, 64, 128, 4096, 8000, 8008, 16000, 16384, 65536, 98304, 786432, 1 << 20, 3 * 1024 * 1024, 12 * 4096 + 8,
    8 * 16411
]


@pytest.mark.parametrize("numel", SIZES)
def test_same_as_upstream_where_upstream_succeeds(upstream_groups, numel):
    assert group_count(numel) == upstream_groups(numel)


@pytest.mark.parametrize("numel", [1, 2, 7, 257, 514, 1000003, 16411, 640 * 257 + 1])
def test_divisor_where_upstream_asserts(upstream_groups, numel):
    with pytest.raises(AssertionError):
        upstream_groups(numel)
    groups = group_count(numel)
    assert numel % groups == 0 and groups >= 1


def test_prime_gets_one_group():
    assert group_count(1000003) == 1 and group_count(7) == 1


def test_groups_stay_near_target_size():
    assert all(numel // group_count(numel) <= 8000 for numel in [640 * 257, 257 * 1024, 514 * 100])


def test_bad_numel():
    with pytest.raises(ValueError, match="non-negative int"):
        group_count(-1)
    with pytest.raises(ValueError, match="non-negative int"):
        group_count(2.0)
