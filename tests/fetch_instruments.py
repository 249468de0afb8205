"""Instruments of the fetch tests (``spec["instruments"]``; hooks as in harness/worker.py): what the
ZeRO-3 weight fetches cost in collectives and operations, and whether packets carried them.

- every run reports ``collectives``: all-gathers issued through DeepSpeed's communication backend during the training
  steps, in all (``all_gathers``) and by the dtype of what was sent (``uint8``: packets; ``int8``: codes sent on
  their own; ``float32`` also counts fp32 scales sent on their own), and ``packets``: packet all-gathers issued by
  the fetch seam (``PacketGather`` handles made), ``quantizes`` (packets made one by one), ``batches`` and
  ``batched`` (calls of ``ops.quantize_packed_many``, and the packets a forward made ahead in them) and ``reused``
  (packets forward or backward sent again instead of quantizing the partition again: ``fetch.quantize_once``), and
  ``past_forward``: the
  packets held as forwards returned and those of them kept for the backward (``fetch._keep_released``), summed
  over the steps. Name this module before
  others whose ``after_training`` gathers.
- a run with ``parts_in_place`` has the torch backend write each parameter's part of a bucket's packets straight
  into its buffer (``WRITES_PARTS``, ``dequantize_parts_into``; off in the others) and reports in ``packets`` how
  many bucket waits wrote their parts so (``parts_in_place``).
- every run reports ``persistent``: how many persistent parameters the optimizer gathers after every step, and
  in how many dtypes; ``secondary_writes_skipped``: hpZ secondary partitions left unwritten inside optimizer steps
  (``patching/seams/secondary.py``); with ``hpz``, ``secondary_writes_due``: those DeepSpeed would write there (the
  gathered parameters without one when a step partitions them); ``skipped_steps``: the engine's count of steps
  that skipped their update.
- a run with ``skip_update_at`` (a step index) has that step skip its update, as on an overflow.
- a run with ``fetch_cost`` also reports ``fetch_cost`` after training: one fetch of the model's largest module
  with several parameters (a bucket) and of its largest parameter alone (a single-parameter fetch), each counted
  from the fetch call to the end of its wait: ``all_gathers``, ``ops`` (aten operations that ran) and ``kernels``
  (those that compute or copy, i.e. would launch a kernel on a GPU: every aten operation but views, allocations
  and metadata; the collectives are not among them), with the names of the kernel operations.
"""
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# aten operations that launch no kernel: views, allocations, metadata
NO_KERNEL = {
    "empty", "empty_strided", "view", "_unsafe_view", "slice", "narrow", "alias", "detach", "as_strided", "unsqueeze",
    "squeeze", "expand", "select", "t", "transpose", "reshape", "split", "split_with_sizes", "unbind", "lift_fresh",
    "_to_copy_noop", "set_", "resize_", "record_stream"
}


def _input_of(args, kwargs):
    """The sent tensor of a TorchBackend all-gather call (self, output, input, ...), by keyword or position."""
    if "input_tensor" in kwargs:
        return kwargs["input_tensor"]
    if "tensor" in kwargs:
        return kwargs["tensor"]
    return args[2] if len(args) > 2 else None


def _dtype_is(dtype):
    return lambda *a, **k: getattr(_input_of(a, k), "dtype", None) == dtype


def before_engine(job):
    from deepspeed_zeropp.backends import torch_ref
    from deepspeed_zeropp.patching.seams import secondary
    torch_ref.WRITES_PARTS = bool(job.run.get("parts_in_place"))
    job.skipped_before = secondary.STEP.skipped


def _skip_update(optimizer):
    """The optimizer's next step skips its update, as on an overflow: its loss-scale update (the one call every
    release makes on that path, with the overflow flag) sees an overflow, once."""
    original = optimizer._update_scale

    def overflowed(*args, **kwargs):
        del optimizer._update_scale
        optimizer.overflow = True
        return original(True)

    optimizer._update_scale = overflowed


def _count_writes_due(job):
    """Counts, as each optimizer step partitions the parameters still gathered, those DeepSpeed would write a
    secondary partition for (hpZ: gathered, with none yet) into the result's ``secondary_writes_due``."""
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus
    optimizer = job.engine.optimizer
    original = optimizer._partition_all_parameters
    job.result["secondary_writes_due"] = 0

    def counting():
        job.result["secondary_writes_due"] += sum(
            1 for p in job.engine.module.parameters()
            if p.ds_status == ZeroParamStatus.AVAILABLE and getattr(p, "ds_secondary_tensor", False) is None)
        return original()

    optimizer._partition_all_parameters = counting


def before_step(job, step):
    if step == 0 and job.run.get("hpz"):
        _count_writes_due(job)
    if job.run.get("skip_update_at") == step:
        _skip_update(job.engine.optimizer)
    elif job.run.get("skip_update_at") == step - 1:  # older releases reset the flag for fp16 only
        job.engine.optimizer.overflow = False
    if step != 0:
        return
    from deepspeed.comm import comm
    from deepspeed_zeropp import ops
    from deepspeed_zeropp.backends import torch_ref
    from deepspeed_zeropp.patching.seams import fetch
    backend = type(comm.cdb)
    counters = job.counters("collectives")
    counters.spy(backend, "all_gather_into_tensor", "all_gathers")
    counters.spy(backend, "all_gather", "all_gathers")
    for dtype in (torch.uint8, torch.int8, torch.float32):
        counters.spy(backend, "all_gather_into_tensor", str(dtype).split(".")[1], _dtype_is(dtype))
    packets = job.counters("packets")
    packets.spy(fetch.PacketGather, "__init__", "packet_all_gathers")
    packets.spy(ops, "quantize_packed", "quantizes")
    packets.spy(ops, "quantize_packed_many", "batches")
    job.reused_before, job.batched_before = fetch.KEPT.reused, fetch.KEPT.batched
    job.past_forward = {"held": 0, "kept": 0}
    keep_released = job.keep_released = fetch._keep_released

    def counting():
        job.past_forward["held"] += len(fetch.KEPT.packets)
        keep_released()
        job.past_forward["kept"] += len(fetch.KEPT.packets)

    fetch._keep_released = counting
    if job.run.get("parts_in_place"):
        packets.spy(torch_ref, "dequantize_parts_into", "parts_in_place")


class _Ops(TorchDispatchMode):

    def __init__(self):
        super().__init__()
        self.ops = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[f"{func.namespace}::{func.overloadpacket.__name__}"] += 1
        return func(*args, **(kwargs or {}))


def _count_fetch(params, quantize):
    """Operations and all-gathers of one fetch of ``params`` (partitioned), from the call to the end of its wait;
    the parameters are partitioned again afterwards."""
    from deepspeed.comm import comm
    backend = type(comm.cdb)
    original = backend.__dict__["all_gather_into_tensor"]
    gathers = []

    def counting(*args, **kwargs):
        gathers.append(str(_input_of(args, kwargs).dtype))
        return original(*args, **kwargs)

    backend.all_gather_into_tensor = counting
    try:
        with _Ops() as mode:
            params[0].all_gather_coalesced(params, quantize=quantize).wait()
    finally:
        backend.all_gather_into_tensor = original
    params[0].partition(params)
    kernels = {
        name: n
        for name, n in mode.ops.items() if name.startswith("aten::") and name[len("aten::"):] not in NO_KERNEL
    }
    return {
        "params": len(params),
        "all_gathers": len(gathers),
        "sent": gathers,
        "ops": sum(mode.ops.values()),
        "kernels": sum(kernels.values()),
        "kernel_ops": dict(sorted(kernels.items())),
    }


def after_training(job):
    """Runs first (this module comes first in the tests' instrument list): the counts of the training steps are
    frozen before other instruments gather parameters."""
    for field in ("collectives", "packets"):
        job.result[field] = dict(job.result.get(field, {}))
    from deepspeed_zeropp.patching.seams import fetch
    job.result["packets"]["reused"] = fetch.KEPT.reused - job.reused_before
    job.result["packets"]["batched"] = fetch.KEPT.batched - job.batched_before
    job.result["packets"]["past_forward"] = job.past_forward
    fetch._keep_released = job.keep_released
    persistent = getattr(job.engine.optimizer, "persistent_parameters", [])
    job.result["persistent"] = {"params": len(persistent), "dtypes": len({p.ds_tensor.dtype for p in persistent})}
    from deepspeed_zeropp.patching.seams import secondary
    job.result["secondary_writes_skipped"] = secondary.STEP.skipped - job.skipped_before
    job.result["skipped_steps"] = job.engine.skipped_steps
    if not job.run.get("fetch_cost"):
        return
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus
    module = job.engine.module
    groups = [list(m.parameters(recurse=False)) for m in module.modules()]
    bucket = max((g for g in groups if len(g) > 1), key=lambda g: sum(p.ds_numel for p in g))
    single = [max(module.parameters(), key=lambda p: p.ds_numel)]
    assert all(p.ds_status == ZeroParamStatus.NOT_AVAILABLE for p in bucket + single)
    quantize = bool(job.run.get("quantized"))
    torch.distributed.barrier()
    job.result["fetch_cost"] = {"bucket": _count_fetch(bucket, quantize), "single": _count_fetch(single, quantize)}
