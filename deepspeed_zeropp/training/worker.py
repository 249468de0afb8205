"""One rank of a harness job: train each configured run with ZeRO-3 and report what happened (rank 0 writes)."""
import json
import math
import os
import subprocess
import sys
import time
import traceback

import torch

from . import models

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp16": torch.float16}


def ds_config(run, dtype):
    zero = {
        "stage": 3,
        "stage3_param_persistence_threshold": 0,  # every parameter is gathered, so every one is quantized
        "reduce_bucket_size": 2**22,  # the defaults (5e8 elements) are far larger than these models
        "zero_quantized_weights": run.get("quantized", False),
        "zero_quantized_nontrainable_weights": run.get("quantized_nontrainable", False),
    }
    if run.get("sequential"):
        zero["stage3_allgather_sequential"] = True
    if run.get("checkpoint"):
        # Without prefetching every step gathers the same buckets (qwZ groups span a whole bucket), so a fresh
        # engine quantizes the same way the saved one did and the next-step losses can be compared closely.
        zero["stage3_prefetch_bucket_size"] = 0
    if run.get("export"):
        zero["stage3_gather_16bit_weights_on_model_save"] = True  # else save_16bit_model writes nothing
    if run.get("quantized_gradients"):
        zero["zero_quantized_gradients"] = True
    if run.get("loco"):  # LoCo's error feedback on qgZ (DeepSpeed 0.16.2 to 0.19.7), e.g. {"err_beta": 0.8}
        zero["zeropp_loco_param"] = run["loco"]
    if run.get("hpz"):
        zero["zero_hpz_partition_size"] = run["hpz"]
    if run.get("offload_param"):
        zero["offload_param"] = {"device": run["offload_param"]}
        if run.get("nvme_path"):
            zero["offload_param"]["nvme_path"] = run["nvme_path"]
    if run.get("offload_optimizer"):
        zero["offload_optimizer"] = {"device": run["offload_optimizer"]}
    config = {
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": 1,
        "zero_optimization": zero,
        "bf16": {
            "enabled": dtype == torch.bfloat16
        },
        "fp16": {
            "enabled": dtype == torch.float16
        },
        "zero_allow_untested_optimizer": True,
        "zero_force_ds_cpu_optimizer": False,  # the harness's torch AdamW, also with the optimizer offloaded
        "steps_per_print": 10**9,
    }
    if run.get("warmup"):  # [peak lr, steps]: linear warm-up, then constant
        peak, steps = run["warmup"]
        config["scheduler"] = {
            "type": "WarmupLR",
            "params": {
                "warmup_min_lr": 0.0,
                "warmup_max_lr": peak,
                "warmup_num_steps": steps,
                "warmup_type": "linear"
            }
        }
    return config


class Counters:
    """Counts calls through DeepSpeed's quantizer and handles without changing what they do."""

    def __init__(self):
        self.counts = {}
        self._restore = []

    def spy(self, owner, attr, key, when=lambda *a, **k: True):
        original = owner.__dict__[attr]

        def counting(*args, **kwargs):
            if when(*args, **kwargs):
                self.counts[key] = self.counts.get(key, 0) + 1
            return original(*args, **kwargs)

        setattr(owner, attr, counting)
        self._restore.append((owner, attr, original))

    def install(self):
        from deepspeed.runtime.zero import partition_parameters as pp, stage3
        from deepspeed_zeropp import qgz
        self.spy(stage3, "all_to_all_quant_reduce", "quantized_gradient_reductions")
        if "all_to_all_loco_quant_reduce" in vars(stage3):
            self.spy(stage3, "all_to_all_loco_quant_reduce", "loco_gradient_reductions")
        self.spy(qgz, "_reduce_scatter_one", "gradients_reduced_in_4_bits")
        self.spy(qgz, "_reduce_scatter_plain", "unquantized_gradient_batches")
        self.spy(pp.CUDAQuantizer, "quantize", "quantize")
        self.spy(pp.CUDAQuantizer, "dequantize", "dequantize")
        self.spy(pp.AllGatherHandle, "wait", "quantized_single_gathers",
                 lambda h, *a, **k: getattr(h, "_AllGatherHandle__quantization", None) is not None)
        self.spy(pp.AllGatherCoalescedHandle, "wait", "quantized_bucket_gathers",
                 lambda h, *a, **k: getattr(h, "quantization", None) is not None)

    # Our code that does work, as opposed to the seams' tests for whether there is any: quantizer calls, the
    # dequantize scopes of gather sites, padding, deferral, qgZ. With no ZeRO++ flag none of them may run.
    WORK = {
        "deepspeed_zeropp.ops": ("quantize", "dequantize", "dequantize_segments"),
        "deepspeed_zeropp.patching.seams.common": ("dequant_target", "restore_dtypes"),
        "deepspeed_zeropp.patching.seams.gathers": ("dequant_target", "restore_dtypes", "_float_partition_views"),
        "deepspeed_zeropp.patching.seams.partitions": ("deferring_quantize", "_zero_padding",
                                                       "quantize_nontrainable_params"),
        "deepspeed_zeropp.qgz": ("_reduce_scatter_one", ),
    }

    def install_work(self):
        import importlib
        for module, names in self.WORK.items():
            for name in names:
                self.spy(importlib.import_module(module), name, f"{module.rsplit('.', 1)[1]}.{name}")

    def remove(self):
        for owner, attr, original in reversed(self._restore):
            setattr(owner, attr, original)


class ForwardChecks:
    """At every module forward (after ZeRO-3 gathered its parameters): dtype kept, and values still equal to
    the originals within the int8 bound wherever they cannot have been trained yet (frozen, or before step 1)."""

    def __init__(self, model, originals=None):
        """``originals``: full values by parameter, for models already partitioned at construction."""
        originals = originals or {}
        self.expected = {
            p: (n, p.dtype, originals.get(p, p).detach().float().clone(), p.requires_grad)
            for n, p in model.named_parameters()
        }
        self.checks = 0
        self.dtype_errors = []
        self.value_errors = []
        self.max_rel_error = 0.0
        self.trained = False
        self.largest = max(original.abs().max().item() for _, _, original, _ in self.expected.values())

    def hook(self, module, inputs):
        for param in module.parameters(recurse=False):
            name, dtype, original, trainable = self.expected[param]
            self.checks += 1
            if param.dtype != dtype:
                self.dtype_errors.append(f"{name}: {param.dtype} (expected {dtype})")
            elif (not trainable or not self.trained) and param.numel() == original.numel():
                self._compare(name, param.detach().float().view(original.shape), original)

    def _compare(self, name, gathered, original):
        """A coalesced bucket quantizes groups that span neighbouring parameters, so a group's absmax can come
        from the largest parameter in the model: one int8 step of that (absmax/128; +absmax itself clamps from
        code 128 to 127), plus the dtype's rounding, bounds the error. Garbage (bits misread, uninitialised buffers) is off by the values' own size."""
        error = (gathered - original.to(gathered.device)).abs().max().item()
        own = original.abs().max().item() or 1.0
        self.max_rel_error = max(self.max_rel_error, error / own)
        if not error <= self.largest / 128 + own * 2**-8:
            self.value_errors.append(f"{name}: max error {error:.3g} (absmax {own:.3g})")

    def attach(self, model):
        for module in model.modules():
            module.register_forward_pre_hook(self.hook)


def apply_patch(spec, run):
    """Patch as the job asks; ``exclude_sites`` leaves chosen sites unpatched (to show what each one fixes)."""
    from deepspeed_zeropp.patching import apply
    apply.unpatch()
    if spec.get("patch"):
        apply.patch(backend=spec.get("backend", "auto"), exclude=run.get("exclude_sites", ()))


def build_model(spec, run):
    """The model, built plainly or under ``zero.Init()`` without a config (partitioned at construction), and a
    full copy of its initial parameters for the value checks."""
    import deepspeed
    torch.manual_seed(spec.get("seed", 0))
    # A bf16 model may train under an fp32 config; a run may train in another dtype than the job's.
    dtype = DTYPES[run.get("dtype") or spec.get("model_dtype", spec["dtype"])]
    if not run.get("zero_init"):
        return models.build(spec["model"], dtype), ForwardChecks
    with deepspeed.zero.Init():
        model = models.build(spec["model"], dtype)
    # One parameter at a time: up to 0.19.5 Init's coalesced synchronous gather waits on its last gloo handle
    # only, so the others may still be in flight when read (seen as NaN from the deterministic-mode fill).
    originals = {}
    for param in model.parameters():
        with deepspeed.zero.GatheredParameters([param]):
            originals[param] = param.detach().clone()
    return model, lambda _: ForwardChecks(model, originals)


def freeze(model, keys):
    for name, param in model.named_parameters():
        if any(key in name for key in keys):
            param.requires_grad_(False)


def gathered_check(engine, checks):
    """Gather one frozen parameter with GatheredParameters (Init's synchronous gather, not the coordinator's)."""
    import deepspeed
    frozen = [p for p in engine.module.parameters() if not p.requires_grad]
    if frozen:
        with deepspeed.zero.GatheredParameters(frozen[:1]):
            name, _, original, _ = checks.expected[frozen[0]]
            checks._compare(f"GatheredParameters({name})", frozen[0].detach().float().view(original.shape), original)


def make_engine(spec, run, dtype):
    import deepspeed
    model, make_checks = build_model(spec, run)
    freeze(model, spec.get("frozen", []))
    checks = make_checks(model)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=spec.get("lr", 1e-3))
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds_config(run, dtype))
    if run.get("freeze_after_init"):  # the LoRA flow upstream documents for quantize_nontrainable_params
        freeze(engine.module, run["freeze_after_init"])
        engine.optimizer.quantize_nontrainable_params()
    return engine, checks


def train_step(engine, spec, step, rank):
    """One optimizer step; returns the loss averaged over ranks and the step's wall time in ms."""
    batch = {k: v.to(engine.device) for k, v in models.batch(spec["model"], step, rank).items()}
    start = time.perf_counter()
    loss = engine(**batch)["loss"]
    engine.backward(loss)
    engine.step()
    mean = loss.detach().float().clone()
    torch.distributed.all_reduce(mean)  # also waits for the step to finish on every rank
    return mean.item() / torch.distributed.get_world_size(), (time.perf_counter() - start) * 1000


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


def reset_hpz_group():
    """DeepSpeed keeps the hpZ group in a module global that every later ZeRO-3 engine in the process adopts,
    zero_hpz_partition_size configured or not: without this, a run after an hpZ run silently gathers from hpZ
    secondary partitions (and an hpZ run after another keeps the first one's group size)."""
    from deepspeed.utils import groups
    groups._ZERO_PARAM_INTRA_PARALLEL_GROUP = None


def forward_values(engine, names):
    """The named parameters as a forward sees them (gathered, dequantized), on CPU."""
    import deepspeed
    values = {}
    for name, param in engine.module.named_parameters():
        if name in names:
            with deepspeed.zero.GatheredParameters([param]):
                values[name] = param.detach().cpu().clone()
    return values


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
        checks._compare(f"GatheredParameters({name}) after writing", param.detach().float().cpu(), new)
    return name


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
    return {
        "mismatched": mismatched,
        "compared": len(before),
        "next_loss_saved": losses_saved[0],
        "next_loss_loaded": losses_loaded[0],
        "next_losses_saved": losses_saved,
        "next_losses_loaded": losses_loaded
    }


def time_reduce(reduce, gradient, groups, reps):
    """Median wall time (ms) of one quantized reduce-scatter over ``reps`` calls after warm-up; None if reps is 0."""
    if not reps:
        return None
    times = []
    for i in range(reps + 3):
        torch.distributed.barrier()
        if gradient.is_cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        reduce([gradient], groups)
        if gradient.is_cuda:
            torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1000)
    return sorted(times[3:])[reps // 2]


def qgz_check(run, spec, rank):
    """qgZ's reduce-scatter on random gradients against the exact mean (fp64), per dtype and shape. Figures are the
    worst over ranks; errors are relative to the largest gradient value; ``error_of_rounded_mean`` is the distance to
    the exact mean rounded once to the dtype (0 up to fp32 summation for the unquantized path)."""
    from deepspeed.accelerator import get_accelerator
    from deepspeed.runtime.zero import stage3
    from deepspeed.utils import groups
    from deepspeed_zeropp.qgz import quantizes
    apply_patch(spec, run)
    world = torch.distributed.get_world_size()
    all_to_all_groups = groups._get_local_all_to_all_group()
    report = []
    for dtype_name, shape in run["cases"]:

        def gradient_of(r):  # every rank's gradient, rebuilt locally from its seed
            generator = torch.Generator().manual_seed(17 * r + len(report))
            return (torch.randn(shape, generator=generator) * run.get("scale", 1.0)).to(DTYPES[dtype_name])

        gradient = gradient_of(rank).to(get_accelerator().current_device_name())
        reduced = stage3.all_to_all_quant_reduce([gradient], all_to_all_groups)[0]
        everyone = torch.stack([gradient_of(r).double() for r in range(world)])
        mean = everyone.mean(dim=0).reshape(-1)
        chunk = -(-mean.numel() // world)
        expected = mean[rank * chunk:(rank + 1) * chunk]
        largest = everyone.abs().max().item() if everyone.numel() else 1.0
        got = reduced.cpu().double()
        if got.shape != expected.shape:  # reported as a wrong numel; the error figures become inf
            got = torch.full_like(expected, math.nan)
        error = (got - expected).abs()
        rounded = expected.to(reduced.dtype).double()
        ms = time_reduce(stage3.all_to_all_quant_reduce, gradient, all_to_all_groups, run.get("time_reps", 0))
        figures = [
            error.max().item() / largest if error.numel() else 0.0,
            (got - rounded).abs().max().item() / largest if error.numel() else 0.0,
            (error.pow(2).mean() / expected.pow(2).mean()).sqrt().item() if error.numel() else 0.0,
            float(reduced.numel() != expected.numel()),
            float(not torch.isfinite(reduced).all()),
        ]
        figures = torch.tensor(figures, dtype=torch.float64, device=gradient.device).nan_to_num(nan=math.inf)
        torch.distributed.all_reduce(figures, op=torch.distributed.ReduceOp.MAX)  # the worst rank's
        worst, worst_rounded, rms_error, wrong_numel, not_finite = figures.tolist()
        report.append(
            dict(dtype=str(reduced.dtype),
                 numel=reduced.numel(),
                 expected_numel=expected.numel(),
                 every_rank_numel_right=not wrong_numel,
                 quantized=quantizes(gradient, world),
                 ms=ms,
                 max_error_of_largest=worst,
                 error_of_rounded_mean=worst_rounded,
                 rms_error_of_rms=rms_error,
                 finite=not not_finite))
    return {"cases": report}


def digest(engine):
    """sha256 of every full parameter (names, dtypes, bytes) in order: equal digests, bit-identical weights.
    One parameter per gather: up to 0.19.5 Init's coalesced gather waits on its last gloo handle only, so the
    other parameters of a list may still be in flight when read."""
    import hashlib
    import deepspeed
    hasher = hashlib.sha256()
    for name, param in engine.module.named_parameters():
        with deepspeed.zero.GatheredParameters([param]):
            full = param.detach().cpu().contiguous()
            hasher.update(f"{name}:{full.dtype}:{tuple(full.shape)}".encode())
            hasher.update(full.view(-1).view(torch.uint8).numpy().tobytes())
    return hasher.hexdigest()


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


def train(run, spec, rank):
    spec = dict(spec, **{key: run[key] for key in ("dtype", "patch") if key in run})  # per-run overrides
    dtype = DTYPES[spec["dtype"]]
    apply_patch(spec, run)
    reset_hpz_group()
    work = Counters()  # from the start: partitioning happens while the engine is built
    work.install_work()
    try:
        engine, checks = make_engine(spec, run, dtype)
    except BaseException:
        work.remove()
        raise
    if spec.get("checks", True):  # off for step-time measurements only
        checks.attach(engine.module)
    counters = Counters()
    counters.install()
    losses, step_ms, written = [], [], None
    try:
        for step in range(spec.get("steps", 5)):
            if run.get("write_back") and step == spec.get("steps", 5) - 1:  # the last step's forward reads it
                written = write_back(engine, checks, rank)
            loss, ms = train_step(engine, spec, step, rank)
            losses.append(loss)
            step_ms.append(ms)
            checks.trained = True
        if run.get("gathered_check"):
            gathered_check(engine, checks)
        final = digest(engine) if run.get("digest") else None
        exported = export_check(engine, spec, run, rank) if run.get("export") else None
    finally:
        counters.remove()
        work.remove()
    # Before the report: the round trip's next step also runs the value checks (written weights included).
    restored = checkpoint_round_trip(engine, spec, run, dtype, rank) if run.get("checkpoint") else None
    result = {
        "losses": losses,
        "step_ms": step_ms,
        "forward_checks": checks.checks,
        "dtype_errors": checks.dtype_errors[:10],
        "value_errors": checks.value_errors[:10],
        "max_rel_error": checks.max_rel_error,
        "counts": counters.counts,
        "seam_work": work.counts,
        "digest": final,
    }
    for key, value in (("written", written), ("export", exported), ("checkpoint", restored)):
        if value is not None:
            result[key] = value
    if run.get("loco"):
        result["error_buffers"] = error_buffers(engine)
    return result


def main(spec_path):
    with open(spec_path) as f:
        spec = json.load(f)
    rank = int(os.environ["RANK"])
    # Deterministic mode also fills torch.empty() with NaN, so reads of uninitialised memory show up every time
    # instead of depending on what the allocator happened to hand out.
    torch.use_deterministic_algorithms(True, warn_only=True)
    report = None
    if spec.get("patch"):
        import deepspeed_zeropp
        report = deepspeed_zeropp.patch(backend=spec.get("backend", "auto"))
    if spec["device"] == "cpu":  # DeepSpeed's compiled op does not exist on CPU: emulate it, bug included
        from .upstream_op import install
        install()
    import deepspeed
    if spec["device"].startswith("cuda"):
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    deepspeed.init_distributed(dist_backend="nccl" if spec["device"] in ("cuda", "cuda-isolated") else "gloo")
    results = {"deepspeed": deepspeed.__version__, "torch": torch.__version__, "report": str(report), "runs": {}}
    for run in spec["runs"]:
        try:
            results["runs"][run["name"]] = (qgz_check if run.get("qgz_check") else train)(run, spec, rank)
        except Exception as error:  # recorded, not hidden: the caller asserts on it
            results["runs"][run["name"]] = {
                "error": f"{type(error).__name__}: {error}",
                "traceback": traceback.format_exc()[-3000:]
            }
            break  # ranks may now disagree on collectives; stop here
    if rank == 0:
        with open(spec["out"], "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
    # Skip interpreter teardown: with DeepSpeed 0.14.x on CPU it sometimes aborts in a C++ destructor
    # ("terminate called without an active exception") after all the work is done and reported.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
