"""Instruments of the multi-rank tests, run inside the harness's ranks (``spec["instruments"] =
"tests.harness_instruments"``; hooks as described in harness/worker.py). Run keys:

- ``write_back``: rank 0 writes a frozen weight through GatheredParameters(modifier_rank=0) before the last step;
  reports ``written`` (its name).
- ``gathered_check``: after training, one frozen weight gathered through GatheredParameters, checked as a forward's.
- ``digest``: ``digest``, a hash of every final parameter (equal digests, bit-identical weights).
- ``export``: ``export``, what zero_to_fp32 and save_16bit_model read back of each frozen weight.
- ``checkpoint`` (with ``next_steps``, ``warm_up``): ``checkpoint``, a save/load round trip into a fresh engine.
- ``loco``: ``error_buffers``, LoCo's per-parameter error buffers after training.

Every run also reports ``seam_work``: calls of our code that does work (as opposed to the seams' tests for whether
there is any), counted from before the engine is built until training ends; and ``left_behind``: how many of the
engines of the job's earlier runs (the checkpoint's fresh ones included), their optimizers, parameters, parameter
partitions and fp32 partitions are still alive when the run starts, by kind ({} when all were freed).
"""
import hashlib
import importlib
import os
import subprocess
import sys
import weakref
from collections import Counter

import torch

from harness import models
from harness.worker import make_engine, release_engine, train_step

# Our code that does work: quantizer calls, the dequantize scopes of gather sites, padding, deferral, qgZ, the ranks'
# agreement check. With no ZeRO++ flag none of them may run.
WORK = {
    "deepspeed_zeropp.ops":
    ("quantize", "dequantize", "dequantize_gathered", "dequantize_segments", "quantize_packed", "dequantize_packed"),
    "deepspeed_zeropp.patching.seams.common": ("dequant_target", "restore_dtypes"),
    "deepspeed_zeropp.patching.seams.gathers": ("dequant_target", "restore_dtypes", "_float_partition_views"),
    "deepspeed_zeropp.patching.seams.partitions":
    ("deferring_quantize", "_zero_padding", "quantize_nontrainable_params"),
    "deepspeed_zeropp.qgz": ("encode", ),
    "deepspeed_zeropp.agreement": ("ensure", ),
}

# (kind, weak reference) of what the engines of finished runs held
FINISHED = []


def track(engine):
    """Weak references to what ``engine`` holds, for the next runs to report as ``left_behind`` if still alive."""
    optimizer = engine.optimizer
    held = {
        "engine": [engine],
        "optimizer": [optimizer],
        "parameter": list(engine.module.parameters()),
        "partition": [p.ds_tensor for p in engine.module.parameters()],
        "fp32_partition": list(getattr(optimizer, "fp32_partitioned_groups_flat", [])),
    }
    FINISHED.extend((kind, weakref.ref(obj)) for kind, objs in held.items() for obj in objs)


def before_engine(job):
    job.result["left_behind"] = dict(Counter(kind for kind, ref in FINISHED if ref() is not None))
    work = job.counters("seam_work")  # from the start: partitioning happens while the engine is built
    for module, names in WORK.items():
        for name in names:
            work.spy(importlib.import_module(module), name, f"{module.rsplit('.', 1)[1]}.{name}")


def before_step(job, step):
    if job.run.get("write_back") and step == job.spec.get("steps", 5) - 1:  # the last step's forward reads it
        job.result["written"] = write_back(job.engine, job.checks, job.rank)


def after_training(job):
    track(job.engine)
    run = job.run
    if run.get("gathered_check"):
        gathered_check(job.engine, job.checks)
    if run.get("digest"):
        job.result["digest"] = digest(job.engine)
    if run.get("export"):
        job.result["export"] = export_check(job.engine, job.spec, run, job.rank)


def after_run(job):
    if job.run.get("checkpoint"):  # its next steps also run the forward checks (written weights included)
        job.result["checkpoint"] = checkpoint_round_trip(job.engine, job.spec, job.run, job.dtype, job.rank)
    if job.run.get("loco"):
        job.result["error_buffers"] = error_buffers(job.engine)


def gathered_check(engine, checks):
    """Gather one frozen parameter with GatheredParameters (Init's synchronous gather, not the coordinator's)."""
    import deepspeed
    frozen = [p for p in engine.module.parameters() if not p.requires_grad]
    if frozen:
        with deepspeed.zero.GatheredParameters(frozen[:1]):
            name, _, original, _ = checks.expected[frozen[0]]
            checks.compare(f"GatheredParameters({name})", frozen[0].detach().float().view(original.shape), original)


def write_back(engine, checks, rank):
    """Rank 0 writes new values into a frozen weight through GatheredParameters(modifier_rank=0); on exit
    DeepSpeed re-partitions every rank's copy from the written data. From here on the value checks expect the
    written values: at the next forward, in the exports, after a checkpoint round trip."""
    import deepspeed
    name, param = next((n, p) for n, p in engine.module.named_parameters() if not p.requires_grad)
    new = torch.randn(param.ds_shape, generator=torch.Generator().manual_seed(7)) * 0.05
    with deepspeed.zero.GatheredParameters([param], modifier_rank=0):
        if rank == 0:
            param.data.copy_(new.to(param.dtype))
    checks.expected[param] = (name, param.dtype, new.to(param.dtype).float(), False)
    with deepspeed.zero.GatheredParameters([param]):
        checks.compare(f"GatheredParameters({name}) after writing", param.detach().float().cpu(), new)
    return name


def digest(engine):
    """sha256 of every full parameter (names, dtypes, bytes) in order: equal digests, bit-identical weights.
    One parameter per gather: up to 0.19.5 Init's coalesced gather waits on its last gloo handle only, so the
    other parameters of a list may still be in flight when read."""
    import deepspeed
    hasher = hashlib.sha256()
    for name, param in engine.module.named_parameters():
        with deepspeed.zero.GatheredParameters([param]):
            full = param.detach().cpu().contiguous()
            hasher.update(f"{name}:{full.dtype}:{tuple(full.shape)}".encode())
            hasher.update(full.view(-1).view(torch.uint8).numpy().tobytes())
    return hasher.hexdigest()


def forward_values(engine, names):
    """The named parameters as a forward sees them (gathered, dequantized), on CPU."""
    import deepspeed
    values = {}
    for name, param in engine.module.named_parameters():
        if name in names:
            with deepspeed.zero.GatheredParameters([param]):
                values[name] = param.detach().cpu().clone()
    return values


def run_zero_to_fp32_script(directory):
    """The zero_to_fp32.py DeepSpeed writes into the checkpoint folder, run as users do; its second argument is
    an output file up to 0.16 and an output folder from then on."""
    output = os.path.join(directory, "zero_to_fp32_output")
    subprocess.run([sys.executable, os.path.join(directory, "zero_to_fp32.py"), directory, output],
                   check=True,
                   capture_output=True)
    path = os.path.join(output, "pytorch_model.bin") if os.path.isdir(output) else output
    return torch.load(path, weights_only=False)


def export_check(engine, spec, run, rank):
    """Every reader of a saved engine gets each frozen weight as a forward uses it, in its dtype: the model
    states' frozen fragments through zero_to_fp32 (its API and its script; the script may widen to fp32) and
    save_16bit_model. Reports the first few weights each reader got wrong."""
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
    frozen = {name for name, param in engine.module.named_parameters() if not param.requires_grad}
    expected = forward_values(engine, frozen)
    directory = os.path.join(os.path.dirname(spec["out"]), f"export-{run['name']}")
    engine.save_checkpoint(directory, tag="export")
    engine.save_16bit_model(directory, "model_16bit.bin")
    torch.distributed.barrier()
    if rank != 0:
        return None
    readers = {
        "zero_to_fp32 API": (get_fp32_state_dict_from_zero_checkpoint(directory, tag="export"), False),
        "zero_to_fp32.py": (run_zero_to_fp32_script(directory), True),
        "save_16bit_model": (torch.load(os.path.join(directory, "model_16bit.bin"), weights_only=False), False),
    }
    wrong = []
    for reader, (state, may_widen) in readers.items():
        mismatches = []
        for name in sorted(frozen):
            got, want = state.get(name), expected[name]
            if got is None or got.shape != want.shape or not torch.equal(got.float(), want.float()):
                mismatches.append(f"{reader}: {name} {None if got is None else got.flatten()[:3].tolist()} "
                                  f"instead of {want.flatten()[:3].tolist()}")
            elif got.dtype != want.dtype and not (may_widen and got.dtype == torch.float32):
                mismatches.append(f"{reader}: {name} {got.dtype} instead of {want.dtype}")
        wrong += mismatches[:3] + ([f"{reader}: {len(mismatches)} of {len(frozen)} wrong"] if mismatches else [])
    return {"frozen": len(frozen), "wrong": wrong}


def partitions(engine):
    """This rank's stored partitions (int8 codes and scales for MixZ++), by parameter name."""
    stored = {}
    for name, param in engine.module.named_parameters():
        stored[name] = param.ds_tensor.detach().clone()
        if hasattr(param.ds_tensor, "ds_quant_scale"):
            stored[name + ".scale"] = param.ds_tensor.ds_quant_scale.detach().clone()
    return stored


def bit_identical(a, b):
    """Same dtype, shape and bytes. Not torch.equal: a partition that is all padding (a 2-element bias at 4 ranks)
    holds the deterministic-mode NaN fill, which is bit-identical on both sides but never equal to itself."""
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.contiguous().view(-1).view(torch.uint8),
                                                                     b.contiguous().view(-1).view(torch.uint8))


def checkpoint_round_trip(engine, spec, run, dtype, rank):
    """save_checkpoint, then a fresh engine loads it: same partitions, same losses on the next ``next_steps``
    steps (with ``warm_up``, after one forward of the fresh engine without gradients). More than one next step
    also checks what the first backward used: with hpZ it gathers the secondary partitions, which a load must
    refresh."""
    directory = os.path.join(os.path.dirname(spec["out"]), f"ckpt-{run['name']}")
    engine.save_checkpoint(directory, tag="step")
    before = partitions(engine)
    steps, next_steps = spec.get("steps", 5), run.get("next_steps", 1)

    def next_losses(trained):
        if run.get("warm_up"):  # see test_checkpoint_round_trip: a first forward gathers some weights unquantized
            with torch.no_grad():
                trained(**{k: v.to(trained.device) for k, v in models.batch(spec["model"], steps, rank).items()})
        torch.manual_seed(steps)  # the RNG (dropout) is not part of a checkpoint: both engines draw the same
        return [train_step(trained, spec, steps + i, rank)[0] for i in range(next_steps)]

    losses_saved = next_losses(engine)
    fresh, _ = make_engine(spec, run, dtype)
    fresh.load_checkpoint(directory, tag="step")
    fresh.empty_partition_cache()  # release whatever loading left gathered: the next forward gathers afresh
    after = partitions(fresh)
    mismatched = [k for k in before if k not in after or not bit_identical(before[k], after[k])]
    everyone = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(everyone, mismatched)  # every rank's partitions, not only rank 0's
    mismatched = [f"rank {r}: {k}" for r, keys in enumerate(everyone) for k in keys]
    losses_loaded = next_losses(fresh)
    track(fresh)
    release_engine(fresh)
    return {
        "mismatched": mismatched,
        "compared": len(before),
        "next_loss_saved": losses_saved[0],
        "next_loss_loaded": losses_loaded[0],
        "next_losses_saved": losses_saved,
        "next_losses_loaded": losses_loaded
    }


def error_buffers(engine):
    """LoCo's per-parameter error buffers (``intra_ef_buf`` / ``inter_ef_buf``): how many, dtypes, reductions served."""
    kept = [p for p in engine.module.parameters() if hasattr(p, "intra_ef_buf")]
    return {
        "parameters": len(kept),
        "dtypes": sorted({str(p.intra_ef_buf[1].dtype)
                          for p in kept} | {str(p.inter_ef_buf[1].dtype)
                                            for p in kept}),
        "uses": sorted({p.intra_ef_buf[0]
                        for p in kept}),
        "nonzero": sum(int(p.intra_ef_buf[1].count_nonzero()) + int(p.inter_ef_buf[1].count_nonzero()) for p in kept),
    }
