"""Group layouts: DeepSpeed's own groups wherever its heuristic succeeds, bounded groups with a short last one
elsewhere, for every numel."""
import math

import pytest
import torch
from hypothesis import example, given, settings, strategies as st

from deepspeed_zeropp.formats.grouping import MAX_GROUP_SIZE, TARGET_GROUP_SIZE, Layout, group_layout


class RecordingOp:
    """Stands in for the compiled op so DeepSpeed's own (unpatched) CUDAQuantizer.quantize can be run on CPU."""
    Symmetric = 0

    def quantize(self, x, groups, bits, kind):
        self.groups = groups
        return x, None


@pytest.fixture(scope="module")
def upstream_groups():
    """DeepSpeed's group count for a numel, or None where DeepSpeed asserts."""
    from deepspeed.runtime.zero.partition_parameters import CUDAQuantizer
    quantizer = CUDAQuantizer.__new__(CUDAQuantizer)
    quantizer.quantizer_cuda_module = RecordingOp()
    quantizer.group_size_cache = {}

    def groups(numel):
        if numel % 8 != 0:  # DeepSpeed asserts numel % (8 * groups) == 0 (after a loop of up to numel steps)
            return None
        try:
            CUDAQuantizer.quantize(quantizer, torch.empty(numel, dtype=torch.float16))
        except AssertionError:
            return None
        return quantizer.quantizer_cuda_module.groups

    return groups


def assert_bounded(numel, layout):
    """groups = ceil(numel / E), every group within DeepSpeed's bound, the last one holding 1..E elements."""
    groups, size = layout
    assert 1 <= size <= MAX_GROUP_SIZE and groups == math.ceil(numel / size)
    assert 1 <= numel - (groups - 1) * size <= size


SIZES = [
    8, 64, 128, 4096, 8000, 8008, 16000, 16384, 65536, 98304, 786432, 1 << 20, 3 * 1024 * 1024, 12 * 4096 + 8,
    8 * 16411
]


@pytest.mark.parametrize("numel", SIZES)
def test_same_as_upstream_where_upstream_succeeds(upstream_groups, numel):
    assert group_layout(numel) == (upstream_groups(numel), numel // upstream_groups(numel))


@settings(max_examples=300, deadline=None)
@given(exponent=st.floats(0, 7), offset=st.integers(0, 64), factor=st.sampled_from([1, 8, 64, 1024]))
@example(exponent=6.0, offset=3, factor=1)  # 1,000,003: a prime
def test_property_upstream_groups_kept_else_bounded(upstream_groups, exponent, offset, factor):
    """Log-uniform sizes up to ~10^7, many of them multiples of 8 (the only sizes DeepSpeed can group): DeepSpeed's
    exact groups where it succeeds, bounded groups elsewhere."""
    numel = max(1, int(10**exponent / factor) + offset) * factor
    layout = group_layout(numel)
    assert_bounded(numel, layout)
    upstream = upstream_groups(numel)
    if upstream is not None:
        assert layout == (upstream, numel // upstream) and layout.covers_exactly(numel)
    else:
        assert layout.group_size <= TARGET_GROUP_SIZE


@pytest.mark.parametrize("numel", [1, 2, 7, 257, 514, 1000003, 16411, 640 * 257 + 1, 8001, 10**7 - 1])
def test_bounded_where_upstream_asserts(upstream_groups, numel):
    assert upstream_groups(numel) is None
    assert_bounded(numel, group_layout(numel))


def test_prime_gets_bounded_groups_with_a_short_last_one():
    """A prime numel cannot be cut into equal groups; it gets groups of at most the target size, the last one
    shorter, all aligned to 16 elements."""
    assert group_layout(1000003) == Layout(126, 7952)
    assert 1000003 - 125 * 7952 == 6003
    assert group_layout(7) == Layout(1, 7) and group_layout(257) == Layout(1, 257)  # up to 8000: one group


def test_empty_is_one_empty_group():
    assert group_layout(0) == Layout(1, 0)


def test_bad_numel():
    with pytest.raises(ValueError, match="non-negative int"):
        group_layout(-1)
    with pytest.raises(ValueError, match="non-negative int"):
        group_layout(2.0)
