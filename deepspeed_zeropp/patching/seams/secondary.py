"""hpZ's secondary partitions written without a host wait, and gathered only once written, in stream order.

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
