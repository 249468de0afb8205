"""Harness instruments (``spec["instruments"]``, see harness/worker.py) for the agreement check.

- ``run["agreement"] == "off"``: ``agreement.ensure`` does nothing for this run (a job as it ran before the check);
  ``"on"``: the check starts afresh. Both report ``collectives``, the calls of torch.distributed's collectives from
  before the engine is built until training ends, and ``store_calls``, the calls on the process group's store the
  check made, by method.
- ``AGREEMENT_STEPS_DIR`` in the environment: every rank appends the number of each training step it starts to
  ``rank<r>.steps`` there, which outlives a run that fails.
"""
import os

import torch.distributed as dist

from deepspeed_zeropp import agreement

COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "_all_gather_base", "reduce_scatter",
               "reduce_scatter_tensor", "_reduce_scatter_base", "all_to_all", "all_to_all_single", "broadcast",
               "reduce", "gather", "scatter", "barrier", "all_gather_object", "broadcast_object_list",
               "all_reduce_coalesced", "all_gather_coalesced", "send", "recv", "isend", "irecv", "batch_isend_irecv")
_restore = []


class CountingStore:
    """A store that counts its callers' method calls in ``counts`` and passes them on."""

    def __init__(self, store, counts):
        self._store, self._counts = store, counts

    def __getattr__(self, name):
        method = getattr(self._store, name)

        def counted(*args, **kwargs):
            self._counts[name] = self._counts.get(name, 0) + 1
            return method(*args, **kwargs)

        return counted


def _replace(owner, attr, value):
    _restore.append((owner, attr, getattr(owner, attr)))
    setattr(owner, attr, value)


def before_engine(job):
    mode = job.run.get("agreement")
    if mode is None:
        return
    collectives = job.counters("collectives")
    for name in COLLECTIVES:
        if name in vars(dist):
            collectives.spy(dist, name, name)
    store_calls = job.result["store_calls"] = {}
    if mode == "off":
        _replace(agreement, "ensure", lambda sends_packets: None)
    else:
        agreement.reset()
        store = agreement._store
        _replace(agreement, "_store", lambda: CountingStore(store(), store_calls))


def before_step(job, step):
    directory = os.environ.get("AGREEMENT_STEPS_DIR")
    if directory:
        with open(os.path.join(directory, f"rank{job.rank}.steps"), "a") as f:
            f.write(f"{step}\n")


def after_training(job):
    while _restore:
        owner, attr, value = _restore.pop()
        setattr(owner, attr, value)
