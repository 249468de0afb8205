"""hpZ's secondary partitions written without a host wait, gathered only once written, in stream order, and not
written where nothing can read them (inside an optimizer step).

DeepSpeed's ``Init._partition_param_sec`` writes a parameter's secondary (node-local) partition on the current
stream, then blocks the host until that stream is idle: the gathers that later read the partition are issued on the
parameter coordinator's all-gather stream, which nothing orders after the write. The partitions are dropped at every
optimizer step and written again at the next forward's releases, so the host waits once per parameter per step
and cannot run ahead of the GPU to issue work (the host waits of ``benchmarks/results/zeropp_bound.md``).

Here the write keeps no host wait; the streams it ran on are noted, and the coordinator's next fetch makes its
all-gather stream wait for them on the device (``wait_stream``: an event, no host wait) before it issues a gather.
Every gather the coordinator issues (fetch and prefetch) is issued inside its ``__all_gather_params``; other gathers
(``GatheredParameters``, checkpoints) run on the current stream, after the write in stream order. Only with qwZ or
MixZ++ on (the partition seam calls in), on an accelerator that does not order streams by itself (CUDA), and with
the coordinator's seam installed (``patch(exclude=...)`` may leave it out): otherwise DeepSpeed's code runs as it is.

Inside an optimizer step the secondary partitions of the parameters the step partitions are not written at all:
the step drops every secondary partition before anything reads one (``optimizer_step``).
"""
import contextlib

from .. import installed
from .common import accelerator as _accelerator

ORDER_SITE = "PartitionedParameterCoordinator._PartitionedParameterCoordinator__all_gather_params"  # its site row
# Streams that wrote secondary partitions since the coordinator last waited for them (usually one: the compute stream).
_written = []


def _resolved():
    return True


@contextlib.contextmanager
def without_host_wait():
    """Around DeepSpeed's ``_partition_param_sec``: its host wait is skipped (the only place it asks
    ``resolves_data_dependency``, on every release since 0.14.4) and the current stream is noted for the
    coordinator's next fetch to wait on."""
    accelerator = _accelerator()
    if accelerator.resolves_data_dependency() or ORDER_SITE not in installed.replaced:
        yield
        return
    shadowed = accelerator.__dict__.get("resolves_data_dependency")
    accelerator.resolves_data_dependency = _resolved
    try:
        yield
    finally:
        if shadowed is None:
            del accelerator.resolves_data_dependency
        else:
            accelerator.resolves_data_dependency = shadowed
        stream = accelerator.current_stream()
        if all(stream != noted for noted in _written):
            _written.append(stream)


def coordinator_fetch(original):
    """Why this seam: hpZ's secondary partitions are written without DeepSpeed's per-parameter host wait
    (``_partition_param_sec``), so the gathers that read them must be ordered after the writes on the device; every
    gather the parameter coordinator issues starts here, before it enters its all-gather stream.

    Seam factory for ``PartitionedParameterCoordinator.__all_gather_params``: when secondary partitions were written
    since the last fetch, the all-gather stream waits for the streams that wrote them, then upstream's method runs."""

    def wrapper(coordinator, *args, **kwargs):
        if _written:
            gathers = coordinator._PartitionedParameterCoordinator__allgather_stream
            while _written:
                gathers.wait_stream(_written.pop())
        return original(coordinator, *args, **kwargs)

    return wrapper


class _Step:
    """The optimizer step running now (``optimizer_step``): whether one is, and how many secondary partitions its
    partitioning has left unwritten since the patch was loaded (``skipped``: a count the tests read)."""
    running = False
    left_unwritten = False
    skipped = 0


STEP = _Step()


def unwritten_in_step():
    """Whether ``_partition_param_sec`` is called inside an optimizer step, where its write is skipped (noted)."""
    if not STEP.running:
        return False
    STEP.left_unwritten = True
    STEP.skipped += 1
    return True


def optimizer_step(original):
    """Why this seam: every optimizer step of ZeRO-3 starts by partitioning each parameter still gathered (every
    persistent one: a GPT's biases and norms, 258 for a 7B) and, with hpZ, writes each one's secondary partition from
    the values the step is about to change; before it ends, the step drops every secondary partition
    (``invalidate_secondary_tensor``), so nothing reads those writes. Each costs the host an allocation, two
    kernels and DeepSpeed's Python, one parameter at a time, while the GPU idles: a simulated 7B step at 64 ranks
    on an H100 is ~1% faster without them (``benchmarks/results/zeropp_bound.md``). Inside the step the seam of
    ``_partition_param_sec`` skips them.

    Seam factory for ``DeepSpeedZeroOptimizer_Stage3.step``: the step runs with the writes skipped. A step that
    returns before dropping the secondary partitions (an overflow or a non-finite gradient norm skips the update)
    would leave the parameters it partitioned without one beside others with one, and DeepSpeed decides by the first
    parameter of a fetch whether the whole fetch reads secondary partitions; so where a write was skipped, every
    secondary partition is dropped as the step leaves, as a completed step drops them: the next fetches read the
    primary partitions until the next forward writes the secondary ones again, as after any step. (DeepSpeed alone
    would read the secondary partitions there: the same weights, quantized in other groups, so the step after a
    skipped update is not bit for bit DeepSpeed's.)"""

    def wrapper(optimizer, *args, **kwargs):
        STEP.running, STEP.left_unwritten = True, False
        try:
            return original(optimizer, *args, **kwargs)
        finally:
            STEP.running = False
            if STEP.left_unwritten:
                STEP.left_unwritten = False
                optimizer.invalidate_secondary_tensor()

    return wrapper
