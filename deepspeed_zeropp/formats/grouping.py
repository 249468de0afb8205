"""Group layout of a quantized buffer: a pure function of its element count (the wire format's one layout rule).

Every rank must derive the same layout from the same numel, so this module depends on nothing but the integer.
A buffer of n >= 1 elements is cut into ``groups`` contiguous groups of ``group_size`` (E) elements, the last one
holding the rest: n - (groups - 1) * E, between 1 and E, and groups = ceil(n / E).

- Where DeepSpeed's own heuristic succeeds, the layout is its groups, all equal (identical numerics to upstream).
- Elsewhere (upstream asserts "number of weights be a multiple of 8"), the layout takes as many groups as groups of
  the target size would need, ceil(n / 8000), balances them and rounds the size up to a multiple of 16 elements, so
  group boundaries are 16-byte boundaries of the codes and of every input dtype; the last group is the short one.
  Groups never exceed 8000 elements, whatever the factors of n. Up to 8000 elements this is one group.
- An empty buffer is one empty group (its scale is 1.0).

A gathered buffer is k such buffers of n elements back to back (each rank quantizes its own partition) with k times
the scales: element i lies in group (i // n) * groups + (i % n) // E. When n is a multiple of E that is i // E.
:class:`GatheredLayout` is that rule as one value, the form in which the layout of codes to dequantize passes from
where it is known (ops' checks, a gather seam, a packet) unchanged to a backend and its kernel.
"""
import functools
import math
from typing import NamedTuple, Optional

TARGET_GROUP_SIZE = 8000  # DeepSpeed's target: groups of at most ~8k elements
MAX_GROUP_SIZE = 16000  # DeepSpeed's hard limit for its own heuristic
ALIGNMENT = 16  # elements per aligned group boundary: 16 bytes of int8 codes, a whole number of 16-byte input packets


class Layout(NamedTuple):
    groups: int
    group_size: int

    def covers_exactly(self, numel):
        """True when all groups are equal (no short last group)."""
        return self.groups * self.group_size == numel


def _upstream_groups(numel):
    """DeepSpeed's heuristic (behaviourally), or None where upstream would raise. Upstream counts up from
    ceil(numel / 8000) to the first count whose groups hold a multiple of 8 elements (up to numel steps); that
    count is the smallest divisor of numel / 8 at or above the start, found here in sqrt(numel) steps."""
    if numel % 8 != 0:
        return None
    start = math.ceil(numel / TARGET_GROUP_SIZE)
    groups = min((d for d in _divisors(numel // 8) if d >= start), default=None)
    if groups is None:
        return None
    while numel % (16 * groups) == 0 and numel / groups > TARGET_GROUP_SIZE:
        groups *= 2
    if numel / groups >= MAX_GROUP_SIZE or numel <= groups:
        return None
    return groups


def _divisors(n):
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in small]


def _bounded_group_size(numel):
    balanced = math.ceil(numel / math.ceil(numel / TARGET_GROUP_SIZE))
    return min(numel, math.ceil(balanced / ALIGNMENT) * ALIGNMENT)


@functools.lru_cache(maxsize=4096)
def group_layout(numel):
    """The ``Layout`` (groups, group_size) a buffer of ``numel`` elements is quantized with."""
    if not isinstance(numel, int) or isinstance(numel, bool) or numel < 0:
        raise ValueError(f"numel must be a non-negative int, got {numel!r}")
    if numel == 0:
        return Layout(1, 0)
    groups = _upstream_groups(numel)
    if groups is not None:
        return Layout(groups, numel // groups)
    group_size = _bounded_group_size(numel)
    return Layout(math.ceil(numel / group_size), group_size)


class GatheredLayout(NamedTuple):
    """The groups of codes to dequantize: ``group_size`` E and the per-rank ``block_numel`` n.

    ``block_numel`` None (or a multiple of E): equal groups of E throughout, element i in group i // E; the codes may
    be a prefix of len(scales) * E. Else the codes are blocks of n elements back to back (or a prefix of them), each
    in ``block_groups`` = ceil(n / E) groups with a short last one: element i in group (i // n) * ceil(n / E) +
    (i % n) // E. Build it with :func:`blocks_of` (from a per-rank numel) or :func:`equal_groups`; backends read it
    through the members below only."""
    group_size: int
    block_numel: Optional[int] = None

    @property
    def uniform(self):
        """True when every group has ``group_size`` elements (element i is in group i // E)."""
        return self.block_numel is None or self.block_numel % self.group_size == 0

    @property
    def block_groups(self):
        """Groups per block, ceil(n / E); None for equal groups throughout."""
        return None if self.uniform else -(-self.block_numel // self.group_size)

    @property
    def kernel_arguments(self):
        """The CUDA kernel's ``(group_size, block_numel)``: equal groups are blocks of one group."""
        return self.group_size, self.group_size if self.uniform else self.block_numel

    def group_of(self, index):
        """The group (scale index) of element ``index``: an int or an integer tensor."""
        if self.uniform:
            return index // self.group_size
        return (index // self.block_numel) * self.block_groups + (index % self.block_numel) // self.group_size

    def fits(self, numel, num_groups):
        """Whether ``numel`` codes with ``num_groups`` scales have this layout: whole blocks of scales, and codes no
        more than those groups hold."""
        if self.uniform:
            return numel <= num_groups * self.group_size
        blocks, rest = divmod(num_groups, self.block_groups)
        return rest == 0 and numel <= blocks * self.block_numel

    def for_scales(self, num_groups):
        """This layout for codes with ``num_groups`` scales: a single block reads as equal groups (its short last
        group is the last group), which every backend serves on its equal-groups path."""
        if self.uniform or num_groups > self.block_groups:
            return self
        return GatheredLayout(self.group_size)


def blocks_of(block_numel, layout=None):
    """The :class:`GatheredLayout` of per-rank buffers of ``block_numel`` elements gathered back to back, each in
    ``layout`` (default: ``group_layout(block_numel)``, the wire's); ``block_numel`` is kept only where their groups
    are not all equal."""
    if layout is None:
        layout = group_layout(block_numel)
    return GatheredLayout(layout.group_size, None if layout.covers_exactly(block_numel) else block_numel)


def equal_groups(group_size):
    """The :class:`GatheredLayout` of equal groups of ``group_size`` elements throughout."""
    return GatheredLayout(group_size)
