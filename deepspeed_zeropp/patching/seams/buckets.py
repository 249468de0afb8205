"""qgZ's gradient buckets reduced on two streams in turn, so that the next bucket's gradient copies and first stage
run while this bucket's inter-node all-to-alls are on the link.

DeepSpeed's ZeRO-3 (with ``overlap_comm``) issues all of a bucket's work on one stream, ``reduce_and_partition_stream``:
the gradients' copies into the bucket's buffer, the reduce-scatter, then one partition copy per parameter. qgZ's
reduce-scatter ends with its inter-node all-to-alls and their decode, so the next bucket's copies, its encode and its
node-local all-to-all wait for the last all-to-all to arrive, and the inter-node link idles while they run (the
between-bucket gaps of ``benchmarks/results/zeropp_bound.md``).

Here qgZ reports (``gradients_read``, its ``on_read``) the point in stream order after which it reads none of the
bucket's gradients; an event is recorded there. After the bucket's work is issued, the next bucket goes to the other
of two streams (DeepSpeed's and one more), which waits on that event only: its copies overwrite the buffer qgZ has
read, and nothing else of the previous bucket's is shared. The two streams alternate bucket by bucket. Before
DeepSpeed's epilogue reduces the last bucket and waits for its stream, DeepSpeed's own stream waits for the other one
and is put back, so the epilogue's wait and every later use of that stream (the overflow check, the step) come after
every bucket's work. Buckets whose reduce did not go through qgZ report nothing and stay on the stream they are on;
without a stream (CPU) or without ``overlap_comm`` (one stream on purpose) DeepSpeed's code runs as it is.
"""
import weakref

from .common import accelerator as _accelerator


class _Streams:
    """One optimizer's two streams: DeepSpeed's (``own``) and ``spare``."""

    def __init__(self, own):
        self.own, self.spare = own, _accelerator().Stream()

    def other(self, stream):
        return self.spare if stream is self.own else self.own


class _Reduce:
    """The bucket being reduced inside the seam (``open``), the event qgZ's report recorded for it, and whether an
    epilogue runs now (``closing``: its buckets stay on the stream it waits for)."""
    open = False
    read = None
    closing = False


_streams = weakref.WeakKeyDictionary()  # optimizer -> _Streams, from its first bucket reduced through qgZ


def gradients_read():
    """qgZ's ``on_read``: inside the seam, records an event on the current stream (the bucket's stream), after
    which the bucket's gradients are no longer read."""
    if _Reduce.open:
        _Reduce.read = _accelerator().Event()
        _Reduce.read.record()


def _applies(optimizer):
    """A stream of its own for the reduce (DeepSpeed gives it the default stream without ``overlap_comm``), on an
    accelerator that does not order streams by itself."""
    stream = getattr(optimizer, "reduce_and_partition_stream", None)
    if stream is None:
        return False
    accelerator = _accelerator()
    return not accelerator.resolves_data_dependency() and stream != accelerator.default_stream()


def reduce_bucket(original):
    """Why this seam: it is where ZeRO-3 issues one gradient bucket's reduce on its one reduce stream, behind which
    the next bucket's copies and qgZ's first stage wait for this bucket's inter-node all-to-alls; after it, the next
    bucket can be put on a second stream ordered after qgZ's last read only.

    Seam factory for ``DeepSpeedZeroOptimizer_Stage3.__reduce_and_partition_ipg_grads``: upstream's method runs;
    when qgZ reported its last read of the bucket and the epilogue is not running, the optimizer's reduce stream
    becomes the other of its two, made to wait for that report's event."""

    def wrapper(optimizer, *args, **kwargs):
        if _Reduce.open or not _applies(optimizer):
            return original(optimizer, *args, **kwargs)
        _Reduce.open, _Reduce.read = True, None
        try:
            result = original(optimizer, *args, **kwargs)
            read = _Reduce.read
        finally:
            _Reduce.open, _Reduce.read = False, None
        if read is not None and not _Reduce.closing:
            streams = _streams.get(optimizer)
            if streams is None:
                streams = _streams[optimizer] = _Streams(optimizer.reduce_and_partition_stream)
            following = streams.other(optimizer.reduce_and_partition_stream)
            following.wait_event(read)
            optimizer.reduce_and_partition_stream = following
        return result

    return wrapper


def gradients_epilogue(original):
    """Why this seam: it is where ZeRO-3 reduces the last bucket and then waits for the reduce stream, which every
    later use of the gradients (the overflow check, the step) also waits for; those waits must cover both streams.

    Seam factory for ``DeepSpeedZeroOptimizer_Stage3.independent_gradient_partition_epilogue``: where the buckets
    alternated streams, DeepSpeed's stream waits for the other one and is the reduce stream again; the buckets the
    epilogue reduces stay on it; then upstream's method runs."""

    def wrapper(optimizer, *args, **kwargs):
        streams = _streams.get(optimizer)
        if streams is not None:
            streams.own.wait_stream(streams.spare)
            optimizer.reduce_and_partition_stream = streams.own
        _Reduce.closing = True
        try:
            return original(optimizer, *args, **kwargs)
        finally:
            _Reduce.closing = False

    return wrapper
