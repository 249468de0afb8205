"""Group count for a quantized buffer: a pure function of its element count.

Every rank must derive the same number of groups from the same numel, so this module depends on nothing
but the integer. Where DeepSpeed's own heuristic succeeds we return its answer (identical numerics to
upstream); where upstream would assert ("number of weights be a multiple of 8") we return a divisor of
numel instead, so any partition size works.
"""
import functools
import math

TARGET_GROUP_SIZE = 8000  # DeepSpeed's target: groups of at most ~8k elements
MAX_GROUP_SIZE = 16000  # DeepSpeed's hard limit for its own heuristic
MIN_FALLBACK_GROUP_SIZE = 64  # below this, scales would cost more than they save


def _upstream_groups(numel):
    """DeepSpeed's heuristic (behaviourally), or None where upstream would raise."""
    groups = math.ceil(numel / TARGET_GROUP_SIZE)
    while groups < numel and numel % (8 * groups) != 0:
        groups += 1
    while numel % (16 * groups) == 0 and numel / groups > TARGET_GROUP_SIZE:
        groups *= 2
    if numel % (8 * groups) != 0 or numel / groups >= MAX_GROUP_SIZE or numel <= groups:
        return None
    return groups


def _divisors(n):
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def _fallback_groups(numel):
    """The fewest groups of at least MIN_FALLBACK_GROUP_SIZE elements that are no larger than the target size.

    If no divisor satisfies both, take the most groups that still keep the minimum size (a prime numel
    therefore gets one group)."""
    divisors = [d for d in _divisors(numel) if numel // d >= min(numel, MIN_FALLBACK_GROUP_SIZE)]
    within_target = [d for d in divisors if numel // d <= TARGET_GROUP_SIZE]
    return min(within_target) if within_target else max(divisors)


@functools.lru_cache(maxsize=4096)
def group_count(numel):
    """Number of contiguous, equal-sized groups to quantize ``numel`` elements with (>= 1, divides numel)."""
    if not isinstance(numel, int) or isinstance(numel, bool) or numel < 0:
        raise ValueError(f"numel must be a non-negative int, got {numel!r}")
    if numel == 0:
        return 1
    return _upstream_groups(numel) or _fallback_groups(numel)
