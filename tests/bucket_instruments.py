"""Instruments of the multi-rank test of the gradient buckets' two reduce streams (patching/seams/buckets.py), run
inside the harness's ranks (hooks as described in harness/worker.py). Run key ``stand_in_streams``: once the engine
is built, the optimizer's reduce stream and the seam's accelerator are tests/stream_stand_ins.py's, which log what
is asked of them (DeepSpeed's CPU accelerator orders everything itself, so DeepSpeed asks nothing of that stream).
Reports ``stream_log``, what the seam asked in order, each step opened by a ``step N`` line, and
``stream_at_step_start``, the optimizer's reduce stream as each step starts."""
from deepspeed_zeropp.patching.seams import buckets
from tests.stream_stand_ins import Accelerator, Stream

_saved = {}  # what the stand-ins replaced, put back after training


def before_step(job, step):
    if not job.run.get("stand_in_streams"):
        return
    optimizer = job.engine.optimizer
    if step == 0:
        log = job.result["stream_log"] = []
        job.result["stream_at_step_start"] = []
        accelerator = Accelerator(log, lambda: optimizer.reduce_and_partition_stream)
        _saved.update(accelerator=buckets._accelerator, stream=optimizer.reduce_and_partition_stream)
        buckets._accelerator = lambda: accelerator
        optimizer.reduce_and_partition_stream = Stream("own", log)
    job.result["stream_log"].append(f"step {step}")
    job.result["stream_at_step_start"].append(optimizer.reduce_and_partition_stream.name)


def after_training(job):
    if _saved:
        buckets._accelerator = _saved.pop("accelerator")
        job.engine.optimizer.reduce_and_partition_stream = _saved.pop("stream")
