"""Group layouts: DeepSpeed's own groups wherever its heuristic succeeds, bounded groups with a short last one
elsewhere, for every numel."""
import math

import pytest
import torch
from hypothesis import example, given, settings, strategies as st

from deepspeed_zeropp.formats import int8
from deepspeed_zeropp.formats.grouping import (MAX_GROUP_SIZE, TARGET_GROUP_SIZE, GatheredLayout, Layout, blocks_of,
                                               equal_groups, group_layout)


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


# --- GatheredLayout: the one form of a gathered buffer's groups, from the seams and ops to the kernels -------------


def _groups_of_blocks(block_numel, blocks):
    """Group of every element of ``blocks`` buffers of ``block_numel`` gathered back to back, built buffer by buffer
    from ``group_layout`` (not from GatheredLayout's formula)."""
    groups, size = group_layout(block_numel)
    return [b * groups + j // size for b in range(blocks) for j in range(block_numel)]


@pytest.mark.parametrize("block_numel", [1, 7, 257, 8000, 8001, 8581, 16000, 24000, 24001, 40000])
@pytest.mark.parametrize("blocks", [1, 2, 3])
def test_blocks_of_gives_each_element_its_blocks_group(block_numel, blocks):
    layout = blocks_of(block_numel)
    groups, size = group_layout(block_numel)
    expected = _groups_of_blocks(block_numel, blocks)
    index = torch.arange(blocks * block_numel)
    assert layout.group_of(index).tolist() == expected
    assert [layout.group_of(i) for i in (0, len(expected) - 1)] == [expected[0], expected[-1]]  # ints as well
    assert layout.group_size == size and layout.fits(blocks * block_numel, blocks * groups)
    assert layout.fits(blocks * block_numel - 1, blocks * groups)  # a prefix (the sequential gather narrows)
    assert not layout.fits(blocks * block_numel + 1, blocks * groups)
    if group_layout(block_numel).covers_exactly(block_numel):
        assert layout == equal_groups(size) and layout.uniform and layout.block_groups is None
        assert layout.kernel_arguments == (size, size)
    else:  # a short last group per block: the block numel is kept, for the kernel as well
        assert layout == GatheredLayout(size, block_numel) and not layout.uniform and layout.block_groups == groups
        assert layout.kernel_arguments == (size, block_numel)
        assert not layout.fits(blocks * block_numel, blocks * groups + 1)  # scales of whole blocks only


@settings(max_examples=200, deadline=None)
@given(block_numel=st.integers(1, 40000), blocks=st.integers(1, 4))
def test_property_blocks_of_matches_per_block_layouts(block_numel, blocks):
    layout = blocks_of(block_numel)
    index = torch.arange(blocks * block_numel)
    assert layout.group_of(index).tolist() == _groups_of_blocks(block_numel, blocks)


def test_equal_groups():
    layout = equal_groups(16)
    assert layout == GatheredLayout(16, None) and layout.uniform and layout.kernel_arguments == (16, 16)
    assert layout.group_of(torch.arange(40)).tolist() == [i // 16 for i in range(40)]
    assert layout.fits(40, 3) and layout.fits(48, 3) and not layout.fits(49, 3)
    assert layout.for_scales(1) is layout
    # a block numel that is a multiple of the group size is equal groups throughout, whoever built it
    assert GatheredLayout(16, 64).uniform and GatheredLayout(16, 64).kernel_arguments == (16, 16)


def test_one_block_reads_as_equal_groups():
    """A single block's short last group is the buffer's last group: equal groups of E read as a prefix, which every
    backend serves on its equal-groups path. Two blocks or more keep the block form."""
    layout = blocks_of(8581)
    groups = group_layout(8581).groups
    assert layout.for_scales(groups) == equal_groups(layout.group_size)
    assert layout.for_scales(2 * groups) is layout
    single = layout.for_scales(groups)
    assert single.group_of(torch.arange(8581)).tolist() == _groups_of_blocks(8581, 1)


def test_explicit_layout_of_blocks():
    """blocks_of with a layout other than the wire's: packets of explicit equal groups, and kernels' test layouts."""
    assert blocks_of(8192, Layout(4, 2048)) == equal_groups(2048)
    layout = blocks_of(5, Layout(1, 8))  # one group larger than the block
    assert layout == GatheredLayout(8, 5) and layout.group_of(torch.arange(15)).tolist() == [i // 5 for i in range(15)]


@pytest.mark.parametrize("numel", [1, 257, 8000, 8001, 1000003])
def test_packet_carries_the_gathered_layout(numel):
    layout = group_layout(numel)
    assert int8.packet(numel, layout.groups, layout.group_size).gathered == blocks_of(numel)
    assert int8.packet(8192, 4, 2048).gathered == equal_groups(2048)
