"""One rank of a harness job: train each configured run with ZeRO-3 and report what happened (rank 0 writes).

Each run reports its per-step losses and step times, the forward checks (dtype of every parameter at every forward,
gathered values against the originals) and ``counts``, calls through DeepSpeed's quantizer and handles.

Instruments measure more than that without living here: ``spec["instruments"]`` names modules (one name or a list;
launch.run_job puts their root on the ranks' PYTHONPATH) whose optional hooks the worker calls with the run's
:class:`Job`, adding the fields they put in ``job.result`` to the run's result:

- ``before_engine(job)``: the run's patch applied, the engine not built yet (ZeRO-3 partitions while it builds);
- ``before_step(job, step)``: before each training step's forward;
- ``after_training(job)``: after the last step, the ``counts`` spies still counting;
- ``after_run(job)``: the spies removed; before the forward checks are reported, so its forwards are checked too.

``RUNNERS`` (a dict: run key -> function of the job returning the run's result) takes over runs that set one of its
keys instead of training them, for checks that need the job's processes but no training.
"""
import importlib
import json
import os
import sys
import traceback

import torch

from deepspeed_zeropp.demo import checks, worker as demo_worker
from deepspeed_zeropp.demo.checks import ForwardChecks
from deepspeed_zeropp.formats.dtypes import BY_NAME as DTYPES
from deepspeed_zeropp.teardown import release as release_engine

from . import models
from .launch import instrument_names


def ds_config(run, dtype, batch_size=4):
    """The demo's config (ZeRO-3, every parameter gathered) with the run's options."""
    config = demo_worker.ds_config(run.get("quantized", False), dtype, batch_size)
    zero = config["zero_optimization"]
    # DeepSpeed's default (5e8 elements) is far larger than these models; a run may set its own
    zero["reduce_bucket_size"] = run.get("reduce_bucket_size", zero["reduce_bucket_size"])
    zero["zero_quantized_nontrainable_weights"] = run.get("quantized_nontrainable", False)
    if run.get("persistence_threshold"):  # parameters of at most this many elements stay whole on every rank
        zero["stage3_param_persistence_threshold"] = run["persistence_threshold"]
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
    zero.update(run.get("zero", {}))  # any other zero_optimization keys, e.g. {"stage3_max_reuse_distance": 0}
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


class Counters(checks.Counters):
    """The demo's counters, and qgZ's and LoCo's reduce-scatters."""

    def install(self):
        from deepspeed.runtime.zero import stage3
        from deepspeed_zeropp import qgz
        self.spy(stage3, "all_to_all_quant_reduce", "quantized_gradient_reductions")
        if "all_to_all_loco_quant_reduce" in vars(stage3):
            self.spy(stage3, "all_to_all_loco_quant_reduce", "loco_gradient_reductions")
        self.spy(qgz, "encode", "gradients_reduced_in_4_bits")
        self.spy(qgz, "reduce_scatter_plain", "unquantized_gradient_batches")
        super().install()


def apply_patch(spec, run):
    """Patch as the job asks; ``exclude_sites`` leaves chosen sites unpatched (to show what each one fixes)."""
    from deepspeed_zeropp.patching import apply
    apply.unpatch()
    if spec.get("patch"):
        apply.patch(backend=spec.get("backend", "auto"), exclude=run.get("exclude_sites", ()))


def build_model(spec, run):
    """The model, built plainly or under ``zero.Init`` (partitioned at construction): without a config, or with
    the run's DeepSpeed config for ``zero_init: "config"`` (as users build for ZeRO++: unpatched DeepSpeed sets up
    its weight quantizer only there); and the value checks' maker, with a full copy of the initial parameters
    unless checks are off."""
    import deepspeed
    torch.manual_seed(spec.get("seed", 0))
    # A bf16 model may train under an fp32 config; a run may train in another dtype than the job's.
    dtype = DTYPES[run.get("dtype") or spec.get("model_dtype", spec["dtype"])]
    checked = spec.get("checks", True)
    unchecked = lambda _: ForwardChecks(None)  # noqa: E731
    if not run.get("zero_init"):
        return models.build(spec["model"], dtype, **spec.get("model_args",
                                                             {})), ForwardChecks if checked else unchecked
    config = ds_config(run, DTYPES[spec["dtype"]], spec.get("batch_size", 4)) if run["zero_init"] == "config" else None
    with deepspeed.zero.Init(config_dict_or_path=config):
        model = models.build(spec["model"], dtype, **spec.get("model_args", {}))
    if not checked:
        return model, unchecked
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


def make_engine(spec, run, dtype):
    import deepspeed
    model, make_checks = build_model(spec, run)
    freeze(model, spec.get("frozen", []))
    checks = make_checks(model)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=spec.get("lr", 1e-3))
    engine, *_ = deepspeed.initialize(model=model,
                                      optimizer=optimizer,
                                      config=ds_config(run, dtype, spec.get("batch_size", 4)))
    if run.get("freeze_after_init"):  # the LoRA flow upstream documents for quantize_nontrainable_params
        freeze(engine.module, run["freeze_after_init"])
        engine.optimizer.quantize_nontrainable_params()
    return engine, checks


def batch_of(spec, step, rank):
    return models.batch(spec["model"], step, rank, spec.get("batch_size", 4), **spec.get("model_args", {}))


def train_step(engine, spec, step, rank):
    """One optimizer step; returns the loss averaged over ranks and the step's wall time in ms."""
    return demo_worker.train_step(engine, batch_of(spec, step, rank))


def reset_hpz_group():
    """DeepSpeed keeps the hpZ group in a module global that every later ZeRO-3 engine in the process adopts,
    zero_hpz_partition_size configured or not: without this, a run after an hpZ run silently gathers from hpZ
    secondary partitions (and an hpZ run after another keeps the first one's group size)."""
    from deepspeed.utils import groups
    groups._ZERO_PARAM_INTRA_PARALLEL_GROUP = None


class Job:
    """One run as the instrument hooks see it: the job's ``spec`` (with the run's overrides), the ``run``, this
    ``rank``, the run's ``dtype``; ``engine`` and ``checks`` (its ForwardChecks) once built; ``result``, the fields
    the hooks report, merged into the run's result."""

    def __init__(self, spec, run, rank, dtype):
        self.spec, self.run, self.rank, self.dtype = spec, run, rank, dtype
        self.engine = self.checks = None
        self.result = {}
        self._counters = []

    def counters(self, field):
        """A Counters reported as the result's ``field``; the worker removes its spies with its own, after
        training (also when the run fails)."""
        counters = Counters()
        self._counters.append(counters)
        self.result[field] = counters.counts
        return counters

    def remove_counters(self):
        for counters in reversed(self._counters):
            counters.remove()


class Instruments:
    """The modules named in ``spec["instruments"]`` (a module name or a list of them), imported in order."""

    def __init__(self, names):
        self.modules = [importlib.import_module(name) for name in instrument_names(names)]
        self.runners = {}
        for module in self.modules:
            self.runners.update(getattr(module, "RUNNERS", {}))

    def call(self, hook, *args):
        for module in self.modules:
            if hasattr(module, hook):
                getattr(module, hook)(*args)

    def runner(self, run):
        """The runner of the first RUNNERS key the run sets, or None: the run trains."""
        return next((runner for key, runner in self.runners.items() if run.get(key)), None)


def start_profiler():
    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    profiler = torch.profiler.profile(activities=activities)
    profiler.start()
    return profiler


def write_profile(profiler, path):
    """The operations and kernels of the profiled steps by their own time (device time where there is a device),
    as a text table at ``path``, and the gzipped Chrome trace beside it."""
    import gzip
    import shutil
    profiler.stop()
    key = "self_device_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
    with open(path, "w") as f:
        f.write(profiler.key_averages().table(sort_by=key, row_limit=40, max_name_column_width=70))
    profiler.export_chrome_trace(path + ".trace.json")
    with open(path + ".trace.json", "rb") as raw, gzip.open(path + ".trace.json.gz", "wb") as packed:
        shutil.copyfileobj(raw, packed)
    os.unlink(path + ".trace.json")


def release_memory():
    """Free the finished run's device memory before the job's next run (its engine released by
    :func:`release_engine`, it is only reachable through reference cycles)."""
    import gc
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def train(job, instruments):
    spec, run, rank = job.spec, job.run, job.rank
    counters = Counters()
    losses, step_ms, profiler = [], [], None
    steps = spec.get("steps", 5)
    profile = run.get("profile") if rank == 0 else None  # {"path": table file, "steps": the last n steps}
    memory = {}
    if torch.cuda.is_available():  # what earlier runs left behind, and this run's peak
        memory["memory_at_start_gb"] = torch.cuda.memory_allocated() / 2**30
        torch.cuda.reset_peak_memory_stats()
    try:
        instruments.call("before_engine", job)  # partitioning happens while the engine is built
        job.engine, job.checks = make_engine(spec, run, job.dtype)
        if spec.get("checks", True):  # off for step-time measurements only
            job.checks.attach(job.engine.module)
        counters.install()
        for step in range(steps):
            instruments.call("before_step", job, step)
            if profile and step == steps - profile.get("steps", 3):
                profiler = start_profiler()
            loss, ms = train_step(job.engine, spec, step, rank)
            losses.append(loss)
            step_ms.append(ms)
            job.checks.trained = True
        if profiler:
            write_profile(profiler, profile["path"])
        instruments.call("after_training", job)
    finally:
        counters.remove()
        job.remove_counters()
    # Before the report: what after_run does (more steps, another engine) also runs the forward checks.
    instruments.call("after_run", job)
    checks = job.checks
    if torch.cuda.is_available():
        memory["peak_memory_gb"] = torch.cuda.max_memory_allocated() / 2**30
    release_engine(job.engine)
    return dict(
        {
            "losses": losses,
            "step_ms": step_ms,
            "forward_checks": checks.checks,
            "dtype_errors": checks.dtype_errors[:10],
            "value_errors": checks.value_errors[:10],
            "max_rel_error": checks.max_rel_error,
            "counts": counters.counts,
            **memory,
        }, **job.result)


def run_one(run, spec, rank, instruments):
    spec = dict(spec, **{key: run[key] for key in ("dtype", "patch") if key in run})  # per-run overrides
    if "patch_ranks" in run:  # only these ranks patched: a job whose nodes disagree
        spec["patch"] = rank in run["patch_ranks"]
    apply_patch(spec, run)
    reset_hpz_group()
    job = Job(spec, run, rank, DTYPES[spec["dtype"]])
    runner = instruments.runner(run)
    return runner(job) if runner else train(job, instruments)


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
        from deepspeed_zeropp.demo.upstream_op import install
        install(gradients=True)
    import deepspeed
    if spec["device"].startswith("cuda"):
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    if spec["device"] == "cuda-shared":
        # DeepSpeed (0.19.8) binds the default group to the rank's GPU, after which torch 2.11 builds every new
        # group by splitting the default one, which gloo cannot do: qgZ's all-to-all groups would fail. An
        # unbound gloo group, set up first, is the one DeepSpeed then uses.
        torch.distributed.init_process_group("gloo")
    deepspeed.init_distributed(dist_backend="nccl" if spec["device"] in ("cuda", "cuda-isolated") else "gloo")
    instruments = Instruments(spec.get("instruments"))
    results = {"deepspeed": deepspeed.__version__, "torch": torch.__version__, "report": str(report), "runs": {}}
    for run in spec["runs"]:
        try:
            results["runs"][run["name"]] = run_one(run, spec, rank, instruments)
        except Exception as error:  # recorded, not hidden: the caller asserts on it
            results["runs"][run["name"]] = {
                "error": f"{type(error).__name__}: {error}",
                "traceback": traceback.format_exc()[-3000:]
            }
            break  # ranks may now disagree on collectives; stop here
        finally:
            if rank == 0:  # after every run: a job stopped later still reports the runs it finished
                write_results(results, spec["out"])
        release_memory()
    if rank == 0:
        write_results(results, spec["out"])


def write_results(results, path):
    with open(path + ".tmp", "w") as f:
        json.dump(results, f, indent=1)
    os.replace(path + ".tmp", path)


if __name__ == "__main__":
    main(sys.argv[1])
    # Skip interpreter teardown: with DeepSpeed 0.14.x on CPU it sometimes aborts in a C++ destructor
    # ("terminate called without an active exception") after all the work is done and reported.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
