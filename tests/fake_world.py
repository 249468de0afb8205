"""One process as rank 0 of a ``world_size``-rank job under torch's ``fake`` process group
(tests/multirank/test_fake_world.py): the harness's worker (harness/worker.py) after
``init_process_group("fake", store=FakeStore())``, so DeepSpeed adopts that group instead of setting up gloo.

Run as the job's one process (``python -m tests.fake_world spec.json``, ``spec["world_size"]`` the ranks the group
stands for); as an instrument (``spec["instruments"]``), it reports ``zeropp_log``, what the ``deepspeed_zeropp``
logger said from before the engine is built until training ends (the agreement check's one line among it), and
``world``, the process group's backend and size as DeepSpeed's engine saw them.
"""
import logging
import os
import sys

_records = []


class _Keep(logging.Handler):

    def emit(self, record):
        _records.append(record.getMessage())


_handler = _Keep(logging.INFO)


def before_engine(job):
    _records.clear()
    logger = logging.getLogger("deepspeed_zeropp")
    logger.setLevel(logging.INFO)
    logger.addHandler(_handler)


def after_training(job):
    import torch.distributed as dist
    logging.getLogger("deepspeed_zeropp").removeHandler(_handler)
    job.result["zeropp_log"] = list(_records)
    job.result["world"] = [dist.get_backend(), dist.get_world_size(), dist.get_rank()]


def main(spec_path):
    import json
    with open(spec_path) as f:
        world = json.load(f)["world_size"]
    # The job's shape as DeepSpeed reads it; two nodes (its CPU accelerator counts a node's devices from LOCAL_SIZE):
    # with every rank on one node DeepSpeed's CPU shared-memory all-reduce would wait for the other ranks' buffers.
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE=str(world), LOCAL_SIZE=str(max(1, world // 2)))
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    from harness import worker
    worker.main(spec_path)


if __name__ == "__main__":
    main(sys.argv[1])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # as harness/worker.py: skip interpreter teardown
