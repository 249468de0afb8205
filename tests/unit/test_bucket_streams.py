"""qgZ's gradient buckets on two streams in turn (patching/seams/buckets.py), with DeepSpeed's reduce and epilogue
stood in by functions that log what they issue on which stream: the next bucket waits on qgZ's report of its last
read only, the streams alternate, the epilogue's buckets and every wait after it are on DeepSpeed's stream, which
first waits for the other; nothing changes without qgZ's report, without a stream of its own, or on the CPU."""
import types

import pytest

from deepspeed_zeropp.patching.seams import buckets
from tests.stream_stand_ins import Accelerator, Stream


class _Optimizer:  # weakly referable, as DeepSpeed's optimizer

    def __init__(self, stream):
        self.reduce_and_partition_stream = stream


@pytest.fixture
def world(monkeypatch):
    log, current = [], []
    accelerator = Accelerator(log, lambda: current[0])
    monkeypatch.setattr(buckets, "_accelerator", lambda: accelerator)
    optimizer = _Optimizer(Stream("own", log))

    def reduce(optimizer, through_qgz=True):  # DeepSpeed's __reduce_and_partition_ipg_grads, as far as streams go
        current[:] = [optimizer.reduce_and_partition_stream or Stream("current", log)]
        log.append(f"reduce on {current[0].name}")
        if through_qgz:
            buckets.gradients_read()

    def epilogue(optimizer):  # DeepSpeed's: the last bucket, then a wait for the reduce stream
        reduce_bucket(optimizer)
        log.append(f"synchronize {optimizer.reduce_and_partition_stream.name}")

    reduce_bucket = buckets.reduce_bucket(reduce)
    return types.SimpleNamespace(log=log,
                                 accelerator=accelerator,
                                 optimizer=optimizer,
                                 reduce=reduce_bucket,
                                 epilogue=buckets.gradients_epilogue(epilogue))


def test_buckets_alternate_streams_each_waiting_on_the_last_read_only(world):
    for _ in range(3):
        world.reduce(world.optimizer)
    world.epilogue(world.optimizer)
    assert world.log == [
        "reduce on own", "read1 on own", "spare waits read1",
        "reduce on spare", "read2 on spare", "own waits read2",
        "reduce on own", "read3 on own", "spare waits read3",
        "own waits spare", "reduce on own", "read4 on own", "synchronize own",
    ]  # yapf: disable
    assert world.optimizer.reduce_and_partition_stream.name == "own"
    world.reduce(world.optimizer)  # the next backward starts on DeepSpeed's stream again
    assert world.log[-3:] == ["reduce on own", "read5 on own", "spare waits read5"]


def test_a_first_bucket_reduced_in_the_epilogue_stays_on_deepspeeds_stream(world):
    world.epilogue(world.optimizer)
    assert world.log == ["reduce on own", "read1 on own", "synchronize own"]


def test_a_bucket_qgz_did_not_reduce_stays_where_it_is(world):
    world.reduce(world.optimizer, through_qgz=False)
    world.reduce(world.optimizer, through_qgz=False)
    world.epilogue(world.optimizer)
    assert world.log == ["reduce on own", "reduce on own", "reduce on own", "read1 on own", "synchronize own"]


@pytest.mark.parametrize("where", ["default stream", "ordered accelerator", "no stream"])
def test_nothing_moves_where_deepspeed_has_one_stream_or_none(world, where):
    if where == "default stream":  # DeepSpeed without overlap_comm
        world.optimizer.reduce_and_partition_stream = world.accelerator.default
    elif where == "ordered accelerator":
        world.accelerator.ordered = True
    else:  # a device DeepSpeed takes as synchronized
        world.optimizer.reduce_and_partition_stream = None
    stream = world.optimizer.reduce_and_partition_stream
    world.reduce(world.optimizer)
    world.reduce(world.optimizer)
    assert world.optimizer.reduce_and_partition_stream is stream
    assert not any("waits" in line or "read" in line for line in world.log)
