"""Train ZeRO-3 configurations as rank 0 of a simulated world, interleaved, and measure each one's steps.

Every configuration's engine is built once (and trains its warm-up steps); a repetition then gives each engine in
turn, the order rotated one further each repetition (A B C, B C A, ...), one untimed step and its timed steps under
each link model, so a ratio between two configurations is taken within one repetition (:func:`run`). Per block:
step times, host CPU time, each phase's host and device time (:class:`PhaseClock`), losses, skipped steps,
collectives (by kind, dtype and link class), the bytes this rank sends per link class and the peak memory; once per
configuration, after the repetitions, the GPU kernel time and launches of two profiled steps, and per modelled link
two more, for the communication the compute leaves exposed.
"""
import contextlib
import gc
import math
import os
import resource
import statistics
import time
from typing import NamedTuple, Optional

import torch

from ..patching.sites import FETCH_SITE as PACKET_SITE  # one all-gather per quantized fetch
from ..patching.sites import INIT_COALESCED_SITE  # the persistent parameters' one all-gather after a step
from ..patching.sites import STEP_SITE  # hpZ: no secondary partition written inside an optimizer step
from ..patching.sites import BUCKET_SITE  # qgZ: the next gradient bucket on a second stream
from ..teardown import release
from . import config as configs, link as links, model as models, timeline, world

QWZ = {"zero_quantized_weights": True}
QGZ = {"zero_quantized_weights": True, "zero_quantized_gradients": True}
HPZ = dict(QGZ, hpz=True)


class Config(NamedTuple):
    label: str
    patched: bool
    zero: dict
    multi_node: bool = False  # qgZ and hpZ need 2 or more nodes (DeepSpeed refuses qgZ's groups on one)
    exclude: tuple = ()  # patch sites left out: to measure what one seam buys
    parts_in_place: bool = True  # the CUDA backend's WRITES_PARTS: a bucket's wait in one kernel, or copies


CONFIGS = {  # the order within a repetition
    "unquantized": Config("unquantized", False, {}),
    "ours-qwz": Config("ours qwZ", True, QWZ),
    # ours with each bucket's wait dequantizing the whole bucket and copying every parameter's part out of it
    "ours-qwz-bucket-copies": Config("ours qwZ, buckets dequantized whole and copied", True, QWZ, parts_in_place=False),
    # ours without the packet seam: codes and scales in two all-gathers each, as upstream sends them
    "ours-qwz-two-gathers": Config("ours qwZ, two all-gathers", True, QWZ, exclude=(PACKET_SITE, )),
    "upstream-qwz": Config("upstream qwZ", False, QWZ),
    "ours-qwz-qgz": Config("ours qwZ+qgZ", True, QGZ, True),
    "upstream-qwz-qgz": Config("upstream qwZ+qgZ", False, QGZ, True),
    "ours-qwz-qgz-bucket-copies": Config("ours qwZ+qgZ, buckets dequantized whole and copied",
                                         True,
                                         QGZ,
                                         True,
                                         parts_in_place=False),
    "ours-qwz-qgz-hpz": Config("ours qwZ+qgZ+hpZ", True, HPZ, True),
    "upstream-qwz-qgz-hpz": Config("upstream qwZ+qgZ+hpZ", False, HPZ, True),
    # ours with Init's coalesced gather left to DeepSpeed: one all-gather per persistent parameter after a step
    "ours-qwz-qgz-hpz-per-parameter": Config("ours qwZ+qgZ+hpZ, persistent gathered one by one",
                                             True,
                                             HPZ,
                                             True,
                                             exclude=(INIT_COALESCED_SITE, )),
    # ours with each optimizer step writing the secondary partitions it drops unread (DeepSpeed's)
    "ours-qwz-qgz-hpz-step-writes": Config("ours qwZ+qgZ+hpZ, secondary partitions written in the step",
                                           True,
                                           HPZ,
                                           True,
                                           exclude=(STEP_SITE, )),
    # ours with every gradient bucket on DeepSpeed's one reduce stream (DeepSpeed's order)
    "ours-qwz-qgz-one-reduce-stream": Config("ours qwZ+qgZ, buckets on one reduce stream",
                                             True,
                                             QGZ,
                                             True,
                                             exclude=(BUCKET_SITE, )),
    "ours-qwz-qgz-hpz-one-reduce-stream": Config("ours qwZ+qgZ+hpZ, buckets on one reduce stream",
                                                 True,
                                                 HPZ,
                                                 True,
                                                 exclude=(BUCKET_SITE, )),
}
UPSTREAM_OF = {  # ours -> upstream's same configuration
    key: key.replace("ours", "upstream")
    for key in CONFIGS if key.startswith("ours") and key.replace("ours", "upstream") in CONFIGS
}

DEEPSPEED_REUSE_DISTANCE = 10**9  # stage3_max_reuse_distance unless a config sets it


def available(keys, topology, device, shape=None, reuse_distance=None):
    """The configurations of ``keys`` this world can run, and why each other one is left out.

    hpZ is left out where its node-local copy would never be read: DeepSpeed keeps a weight gathered from forward to
    backward when its next use comes within ``reuse_distance`` parameters, and no use is further away than forward
    and backward over every weight (2 x the model's parameters)."""
    kept, left_out = [], {}
    reuse = DEEPSPEED_REUSE_DISTANCE if reuse_distance is None else reuse_distance
    for key in keys:
        config = CONFIGS[key]
        if config.multi_node and topology.nodes < 2:
            left_out[key] = "needs 2 or more nodes"
        elif config.zero.get("hpz") and shape is not None and 2 * shape.parameters < reuse:
            left_out[key] = (f"hpZ's node-local copy would never be read: stage3_max_reuse_distance {reuse:.3g} "
                             f"exceeds 2 x this model's {shape.parameters / 1e9:.3g}B parameters, so DeepSpeed "
                             "keeps every weight gathered from forward to backward; --reuse-distance 0 measures hpZ")
        elif device == "cpu" and config.zero and not config.patched:
            left_out[key] = "DeepSpeed's quantizer op needs CUDA"
        else:
            kept.append(key)
    return kept, left_out


def ds_config(config, shape, topology, micro_batch, dtype, reuse_distance=None, buckets=None):
    """The user's DeepSpeed config for this model: ``buckets`` (zero_optimization sizes: the user's config's, or a
    search's candidate; keys left out take DeepSpeed's defaults), or else the HF Trainer's "auto" sizes for its
    width. hpZ's partition is GPUs per node unless ``buckets`` names one.

    ``reuse_distance``: DeepSpeed's ``stage3_max_reuse_distance`` (its default, 1e9 parameters, keeps a small model's
    weights gathered from forward to backward, so hpZ's node-local re-fetch never runs; 0 releases every one)."""
    sizes = configs.hf_auto(shape.width) if buckets is None else dict(buckets)
    zero = {"stage": 3, **{k: v for k, v in config.zero.items() if k != "hpz"}}
    if config.zero.get("hpz"):
        zero[configs.HPZ] = topology.gpus_per_node
    zero.update({k: v for k, v in sizes.items() if k != configs.HPZ or config.zero.get("hpz")})
    if reuse_distance is not None:
        zero["stage3_max_reuse_distance"] = reuse_distance
    return {
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": 1,
        "zero_optimization": zero,
        "bf16": {
            "enabled": dtype == torch.bfloat16
        },
        "fp16": {
            "enabled": dtype == torch.float16
        },
        "zero_allow_untested_optimizer": True,
        "zero_force_ds_cpu_optimizer": False,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }


def set_patch(config):
    from ..backends import cuda
    from ..patching import apply
    apply.unpatch()
    cuda.WRITES_PARTS = config is None or config.parts_in_place
    if config is not None and config.patched:
        apply.patch(exclude=config.exclude)


def build(config, shape, topology, micro_batch, dtype, reuse_distance=None, buckets=None):
    import deepspeed
    torch.manual_seed(0)
    ds = ds_config(config, shape, topology, micro_batch, dtype, reuse_distance, buckets)
    with deepspeed.zero.Init(config_dict_or_path=ds, dtype=dtype):
        net = models.GPT(shape)
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-4)
    engine, *_ = deepspeed.initialize(model=net, optimizer=optimizer, config=ds)
    return engine


def step(engine, shape, micro_batch, index, mark=None):
    """One optimizer step; (loss, wall ms, host CPU ms). The loss's ``item()`` waits for the GPU. ``mark``: a
    context manager factory, called with each phase's name (timeline.PHASE_MARK + phase) around that phase."""
    mark = mark or (lambda name: contextlib.nullcontext())
    forward, backward, update = (timeline.PHASE_MARK + phase for phase in timeline.PHASES)
    tokens, labels = models.batch(shape, micro_batch, index, engine.device)
    wall, cpu = time.perf_counter(), time.process_time()
    with mark(forward):
        loss = engine(tokens, labels)
    with mark(backward):
        engine.backward(loss)
    with mark(update):  # the loss's wait for the GPU too: the phases' host windows then cover the whole step
        engine.step()
        value = loss.item()
    return value, (time.perf_counter() - wall) * 1e3, (time.process_time() - cpu) * 1e3


def _involuntary_switches():
    """How often the kernel has taken the CPU from the calling thread so far (0 where no per-thread count exists)."""
    who = getattr(resource, "RUSAGE_THREAD", None)
    return 0 if who is None else resource.getrusage(who).ru_nivcsw


class PhaseClock:
    """A ``mark`` for :func:`step` that times its phases without a profiler (whose per-launch cost makes a
    host-bound phase look longer than it is): the host's window, from entering a phase to leaving it, and on CUDA
    the device's, between events recorded on the current stream as the host enters and leaves (the time that stream
    took over the phase's work, its waits on the communication streams included). Beside them, what tells a slow host
    from more work: the main thread's own CPU time in the window (``thread_ms``: less than the host's window where
    the thread waited or was not running) and the times the kernel took the CPU from it there
    (``involuntary_switches``: other processes wanting the same cores). :meth:`take` after the step (whose loss
    ``item()`` has waited for the GPU) gives them."""

    def __init__(self, cuda):
        self.cuda, self.marks = cuda, []

    def _now(self):
        event = None
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
        return time.perf_counter(), time.thread_time(), _involuntary_switches(), event

    @contextlib.contextmanager
    def __call__(self, name):
        start = self._now()
        yield
        self.marks.append((name[len(timeline.PHASE_MARK):], start, self._now()))

    def take(self):
        """{phase: {"host_ms", "thread_ms", "involuntary_switches", "device_ms" (CUDA only)}} of the phases marked
        since the last take."""
        found = {}
        for phase, (host0, thread0, switches0, event0), (host1, thread1, switches1, event1) in self.marks:
            found[phase] = {
                "host_ms": (host1 - host0) * 1e3,
                "thread_ms": (thread1 - thread0) * 1e3,
                "involuntary_switches": switches1 - switches0
            }
            if event0 is not None:
                event1.synchronize()
                found[phase]["device_ms"] = event0.elapsed_time(event1)
        self.marks = []
        return found


ALLOCATOR_COUNTS = {  # the CUDA caching allocator's counters a timed step's figures report, per step
    "alloc_retries_per_step": "num_alloc_retries",  # cache freed and an allocation retried: the host waits for the GPU
    "device_mallocs_per_step": "num_device_alloc",  # cudaMalloc calls: the cache (per stream) had no block to reuse
    "device_frees_per_step": "num_device_free",  # cudaFree calls, each synchronising the device
}


class GarbageClock:
    """Python's cyclic garbage collector while it is entered: the collections it ran and the time they took (a step
    whose objects pile up from step to step pays more of it each time). :meth:`figures` after leaving also counts
    the objects the collector tracks then."""

    def __init__(self):
        self.ms, self.collections, self._start = 0.0, 0, None

    def _note(self, phase, info):
        if phase == "start":
            self._start = time.perf_counter()
        elif self._start is not None:
            self.ms += (time.perf_counter() - self._start) * 1e3
            self.collections, self._start = self.collections + 1, None

    def __enter__(self):
        gc.callbacks.append(self._note)
        return self

    def __exit__(self, *exc):
        gc.callbacks.remove(self._note)

    def figures(self, steps):
        return {
            "gc_ms_per_step": self.ms / steps,
            "gc_collections_per_step": self.collections / steps,
            "gc_tracked_objects": len(gc.get_objects())
        }


def _allocator_counts(cuda):
    """The counters of ``ALLOCATOR_COUNTS`` so far, 0 each on the CPU."""
    stats = torch.cuda.memory_stats() if cuda else {}
    return {key: stats.get(name, 0) for key, name in ALLOCATOR_COUNTS.items()}


def _cpu_load():
    """(wall s, this process's CPU s, the machine's busy CPU s or None): differences of two give how many cores
    this process and the whole machine kept busy in between. The machine's figure is the kernel's (/proc/stat, in
    its clock ticks); beside this process's it shows what other processes on the host took."""
    machine = None
    try:
        with open("/proc/stat") as stat:
            ticks = [int(field) for field in stat.readline().split()[1:]]
        idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle and waiting for I/O
        machine = (sum(ticks[:8]) - idle) / os.sysconf("SC_CLK_TCK")  # user to steal; guests are counted in user
    except (OSError, ValueError, IndexError):
        pass
    return time.perf_counter(), time.process_time(), machine


def _cores_busy(before, after):
    """{"this_process": cores, "machine": cores or None} between two :func:`_cpu_load` readings."""
    wall = max(after[0] - before[0], 1e-9)
    machine = None if before[2] is None or after[2] is None else (after[2] - before[2]) / wall
    return {"this_process": (after[1] - before[1]) / wall, "machine": machine}


def _median_phases(steps):
    """The per-phase median of each figure over ``steps`` (PhaseClock.take's answers)."""
    return {
        phase: {
            figure: statistics.median(s[phase][figure] for s in steps)
            for figure in steps[0][phase]
        }
        for phase in steps[0]
    }


def profiled(engine, shape, micro_batch, first, steps=2):
    """GPU kernel time, kernel launches and host waits for the GPU (the CUDA runtime's synchronize calls: each
    stalls the host until the GPU catches up) per step, over ``steps`` profiled steps (not the timed ones); and the
    communication the compute leaves exposed and the part of it launched compute waited on, with the collectives'
    time in all and concurrent (timeline.py: None where no link model put a collective's time on the timeline)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile, record_function
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for i in range(steps):
            step(engine, shape, micro_batch, first + i, mark=record_function)
    kernels = [
        e for e in prof.events() if e.device_type == DeviceType.CUDA and timeline.is_work(e)
        and "memcpy" not in e.name.lower() and "memset" not in e.name.lower()
    ]  # the phases' ranges the profiler mirrors on the device are no kernels (timeline.is_work)
    waits = [e for e in prof.events() if e.device_type == DeviceType.CPU and e.name in SYNCHRONIZE_CALLS]
    return {
        "kernel_ms_per_step": sum(e.device_time_total for e in kernels) / 1e3 / steps,
        "kernel_launches_per_step": len(kernels) / steps,
        "host_waits_per_step": len(waits) / steps,
        **timeline.figures(prof.events(), steps),
    }


def profiled_links(engine, plan, first, steps=2):
    """{link: figures} of ``steps`` profiled steps under each of the plan's modelled links: exposed, waited, total
    and concurrent communication ms per step, and per phase where marked (timeline.py), beside the link model's
    time of the same steps."""
    found = {}
    try:
        for i, (name, link) in enumerate((n, link) for n, link in plan.links.items() if link is not None):
            world.set_link(link)
            world.reset_counts()
            figures = profiled(engine, plan.shape, plan.micro_batch, first + i * steps, steps)
            found[name] = {
                k: v
                for k, v in figures.items() if k.startswith(("exposed_comm", "comm", "compute_", "host_", "idle_in_"))
            }
            found[name]["modelled_link_ms_per_step"] = sum(counted(steps)["modelled_link_ms"].values())
    finally:
        world.set_link(None)
    return found


SYNCHRONIZE_CALLS = ("cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize")


def counted(steps):
    """Collectives (kind/dtype/link class), MiB sent and modelled link time per link class, per step, since the
    last reset."""
    return {
        "collectives": {
            "/".join(key): n / steps
            for key, n in sorted(world.STATE.counts.items())
        },
        "wire_mb": {
            k: v / 2**20 / steps
            for k, v in world.STATE.wire_bytes.items()
        },
        "modelled_link_ms": {
            k: v / 1e3 / steps
            for k, v in world.STATE.modelled_us.items()
        },
    }


def proof(key, collectives, topology):
    """What the run's collectives must show for the configuration to have run as named (empty when it did)."""
    config, problems = CONFIGS[key], []
    # Quantized weights travel as int8 codes (upstream: codes, then fp32 scales) or as byte packets (ours: codes
    # and scales in one buffer, docs/numerics.md)
    int8_gathers = sum(n for k, n in collectives.items()
                       if k.split("/")[:2] in (["all_gather", "int8"], ["all_gather", "uint8"]))
    if config.zero.get("zero_quantized_weights") and not int8_gathers:
        problems.append("no int8 all-gather")
    if not config.zero and int8_gathers:
        problems.append("int8 all-gathers in an unquantized run")
    if config.zero.get("zero_quantized_gradients") and not any(
            k.startswith("all_to_all/int8") or k.startswith("all_to_all/uint8") for k in collectives):
        problems.append("no 4-bit all-to-all")
    if config.zero.get("hpz") and topology.nodes > 1 and not any(
            k.startswith("all_gather/") and k.endswith("/intra") for k in collectives):
        problems.append("no node-local (hpZ) all-gather: backward re-fetched no weight, so hpZ's node-local copy was "
                        "never read; DeepSpeed keeps a weight gathered from forward to backward when its next use is "
                        "within stage3_max_reuse_distance parameters (--reuse-distance 0 releases every one) or when "
                        "a prefetch bucket as large as the model fetched it ahead")
    return problems


class Plan(NamedTuple):
    """What to measure: a model ``shape`` in a ``topology``, under each of ``links`` ({name: link.Link, or None for
    a free link}), ``steps`` timed steps after ``warmup`` untimed ones per link, ``reps`` repetitions."""
    shape: models.Shape
    topology: world.Topology
    links: dict
    keys: tuple
    reps: int = 3
    steps: int = 10
    warmup: int = 2
    micro_batch: int = 4
    dtype: torch.dtype = torch.bfloat16
    device: str = "cuda"
    profile: bool = True  # kernel time and launches from two more steps in the first repetition (CUDA only)
    reuse_distance: Optional[int] = None
    buckets: Optional[dict] = None  # zero_optimization sizes of every configuration (None: the HF Trainer's "auto")

    def reuse(self):
        """The stage3_max_reuse_distance the runs use (None: DeepSpeed's default)."""
        if self.reuse_distance is not None:
            return self.reuse_distance
        return (self.buckets or {}).get("stage3_max_reuse_distance")


def run(plan, progress=print, on_rep=None):
    """Measure the plan; returns a dict of every figure. ``on_rep(results)`` runs after every repetition (to write
    partial results).

    Every configuration's engine is built once and kept; a repetition then gives each engine in turn (the order
    rotated one further each repetition) one untimed step and its timed steps under each link, with the patch set
    as that configuration needs just before (the patch acts through DeepSpeed's classes, so an engine runs patched
    exactly when the patch is on). Engines alive side by side cost memory only; building one costs as long as
    tens of steps, so building once per configuration buys the repetitions."""
    kept, left_out = available(plan.keys, plan.topology, plan.device, plan.shape, plan.reuse())
    topology = plan.topology
    results = {
        "shape": plan.shape._asdict(),
        "parameters": plan.shape.parameters,
        "topology": {
            "world_size": topology.world_size,
            "gpus_per_node": topology.gpus_per_node,
            "nodes": topology.nodes
        },
        "link_model": links.MODEL_VERSION,
        "links": {
            name: (link.describe() if link else "free: collectives cost only their copies")
            for name, link in plan.links.items()
        },
        "settings": {
            k: v if isinstance(v, (int, float, str, type(None))) else str(v)
            for k, v in plan._asdict().items() if k not in ("shape", "topology", "links")
        },
        "configs": kept,
        "left_out": left_out,
        "reps": [],
        "runs": {},
    }
    engines = {}
    try:
        for i, key in enumerate(kept):
            progress(f"building {i + 1}/{len(kept)}: {CONFIGS[key].label}")
            engines[key], results["runs"][key] = _build_and_warm(key, plan)
        for rep in range(plan.reps):
            order = kept[rep % len(kept):] + kept[:rep % len(kept)]
            runs = {}
            for i, key in enumerate(order):
                progress(f"repetition {rep + 1}/{plan.reps}, {i + 1}/{len(order)}: {CONFIGS[key].label}")
                runs[key] = _block(key, engines[key], plan, results["runs"][key])
            results["reps"].append(runs)
            if on_rep:
                on_rep(results)
        if plan.profile and plan.device == "cuda":
            for key in kept:
                progress(f"profiling {CONFIGS[key].label}")
                set_patch(CONFIGS[key])
                figures = profiled(engines[key], plan.shape, plan.micro_batch, 10**6)  # no link: no comm figures
                results["runs"][key].update({k: v for k, v in figures.items() if v is not None})
                results["runs"][key]["profiled_links"] = profiled_links(engines[key], plan, 10**6 + 2)
    finally:
        set_patch(None)
        for engine in engines.values():
            release(engine)
    return results


def _build_and_warm(key, plan):
    """A configuration's engine and what is known of it before the timed steps: build seconds, its resident
    memory, the warm-up losses, its skipped-step count so far."""
    from deepspeed.utils import groups
    config = CONFIGS[key]
    set_patch(config)
    groups._ZERO_PARAM_INTRA_PARALLEL_GROUP = None  # hpZ's group: an engine built while it is set adopts it
    cuda = plan.device == "cuda"
    before = torch.cuda.memory_allocated() if cuda else 0
    started = time.perf_counter()
    engine = build(config, plan.shape, plan.topology, plan.micro_batch, plan.dtype, plan.reuse_distance, plan.buckets)
    info = {"build_s": time.perf_counter() - started}
    if cuda:
        info["resident_gb"] = (torch.cuda.memory_allocated() - before) / 2**30
    world.set_link(None)
    info["warmup_losses"] = [step(engine, plan.shape, plan.micro_batch, i)[0] for i in range(plan.warmup)]
    info["step_index"] = plan.warmup
    return engine, info


def _block(key, engine, plan, info):
    """One repetition of one configuration: an untimed step, then ``plan.steps`` timed ones per link."""
    config, shape, batch = CONFIGS[key], plan.shape, plan.micro_batch
    cuda = plan.device == "cuda"
    set_patch(config)
    world.set_link(None)
    skipped_before = engine.skipped_steps
    losses = [step(engine, shape, batch, info["step_index"])[0]]
    index, by_link, clock = info["step_index"] + 1, {}, PhaseClock(cuda)
    if cuda:
        torch.cuda.synchronize()
        start_memory = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    for name, link in plan.links.items():
        world.set_link(link)
        world.reset_counts()
        times, phases, before, load = [], [], _allocator_counts(cuda), _cpu_load()
        with GarbageClock() as garbage:
            for i in range(plan.steps):
                times.append(step(engine, shape, batch, index + i, mark=clock))
                phases.append(clock.take())
        cores = _cores_busy(load, _cpu_load())
        index += plan.steps
        losses += [t[0] for t in times]
        by_link[name] = {
            "step_ms": [t[1] for t in times],
            "cpu_ms": [t[2] for t in times],
            "median_ms": statistics.median(t[1] for t in times),
            "median_cpu_ms": statistics.median(t[2] for t in times),
            "phase_ms": _median_phases(phases),
            **{
                key: (count - before[key]) / plan.steps
                for key, count in _allocator_counts(cuda).items()
            },
            "cores_busy": cores,
            **garbage.figures(plan.steps),
            **counted(plan.steps),
        }
        by_link[name]["problems"] = proof(key, by_link[name]["collectives"], plan.topology)
    world.set_link(None)
    info["step_index"] = index
    result = {"by_link": by_link, "losses": losses, "skipped_steps": engine.skipped_steps - skipped_before}
    if cuda:  # this engine's resident memory plus what its steps added at their peak
        result["peak_memory_gb"] = info["resident_gb"] + (torch.cuda.max_memory_allocated() - start_memory) / 2**30
    result["finite"] = all(math.isfinite(loss) for loss in losses + info["warmup_losses"])
    return result
