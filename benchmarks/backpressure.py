"""What DeepSpeed's memory backpressure costs a link-bound ZeRO-3 step, measured within one process.

ZeRO-3 on CUDA keeps the host from running ahead of the GPU: after each gathered parameter is waited for, the
parameter coordinator records an event and, once more than 2 such events are pending, blocks the host on the
oldest; the gradient reduction does the same with its reduce events. Where the link is the bottleneck those waits
are where the host stalls (``host_waits_per_step`` in the simulated world's profiled steps). Here, rank 0 of a
simulated world (``deepspeed_zeropp.simulate``) builds each configuration once and then steps it under one
modelled link with the limits as DeepSpeed sets them and with each limit lifted, interleaved round by round
(A B C, A B C, ...), counting the host's event waits per step by the code that asked for them and the peak memory.
With ``--dump`` it also writes one profiled step's GPU activities and the host's phase windows as JSON, so the
timeline figures (``deepspeed_zeropp/simulate/timeline.py``) can be examined without a GPU.

    python benchmarks/backpressure.py --model gpt-7b --nodes 8 --inter-gbps 12.5 \
        --deepspeed-config benchmarks/configs/gpt7b_tuned.json --configs ours-qwz-qgz-hpz [--rounds 3] [--dump]
writes $OUTDIR/backpressure.json (and timeline_<config>.json.gz).
"""
import argparse
import collections
import gzip
import json
import os
import statistics
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import commit  # noqa: E402

LIFTED = 10**9
VARIANTS = {  # name -> (the fetch events' limit, the reduce events' limit); None: as DeepSpeed sets it
    "deepspeed": (None, None),
    "fetch lifted": (LIFTED, None),
    "both lifted": (LIFTED, LIFTED),
}
FETCH_LIMIT = "_PartitionedParameterCoordinator__max_ongoing_fetch_events"


def coordinators(engine):
    offload = engine.optimizer.parameter_offload
    found = getattr(offload, "param_coordinators", None)
    return list(found.values()) if found else [offload.get_param_coordinator()]


def set_limits(engine, defaults, fetch, reduce):
    for c in coordinators(engine):
        setattr(c, FETCH_LIMIT, defaults[0] if fetch is None else fetch)
    engine.optimizer.max_param_reduce_events = defaults[1] if reduce is None else reduce


class Waits:
    """Counts the host's waits on CUDA events (and whole-device synchronizations) by the first caller outside
    torch."""

    def __init__(self):
        import torch
        self.sites = collections.Counter()
        self._saved = [(torch.cuda.Event, "synchronize"), (torch.cuda, "synchronize")]
        self._saved = [(owner, name, getattr(owner, name)) for owner, name in self._saved]
        for owner, name, original in self._saved:
            setattr(owner, name, self._counting(original, f"{getattr(owner, '__name__', owner)}.{name}"))

    def _counting(self, original, label):
        sites = self.sites

        def wrapper(*args, **kwargs):
            torch_dir = os.sep + "torch" + os.sep
            caller = next((f for f in reversed(traceback.extract_stack()[:-1]) if torch_dir not in f.filename), None)
            where = "?" if caller is None else f"{Path(caller.filename).name}:{caller.lineno} {caller.name}"
            sites[f"{label} from {where}"] += 1
            return original(*args, **kwargs)

        return wrapper

    def restore(self):
        for owner, name, original in self._saved:
            setattr(owner, name, original)


def dump_timeline(engine, plan, index, path):
    """One profiled step under the plan's link: its GPU activities and the host's phase windows, as JSON."""
    from torch.profiler import ProfilerActivity, profile, record_function
    from deepspeed_zeropp.simulate import runner, timeline
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        runner.step(engine, plan.shape, plan.micro_batch, index, mark=record_function)
    events = prof.events()
    activities = timeline.from_profile(events)
    from torch.autograd import DeviceType
    runtime = collections.Counter(e.name for e in events
                                  if e.device_type == DeviceType.CPU and e.name.startswith("cu"))
    with gzip.open(path, "wt") as f:
        json.dump(
            {
                "activities": [list(a) for a in activities],
                "windows": timeline.phase_windows(events),
                "comm_streams": sorted(timeline.communication_streams(activities)),
                "runtime_calls": dict(runtime),
                "figures": timeline.figures(events, 1),
            }, f)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="gpt-7b")
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--inter-gbps", type=float, default=12.5, help="per GPU (x GPUs per node: per node)")
    parser.add_argument("--deepspeed-config", default="benchmarks/configs/gpt7b_tuned.json")
    parser.add_argument("--configs", nargs="+", default=["ours-qwz-qgz-hpz"])
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--dump", action="store_true")
    args = parser.parse_args(argv)

    import torch
    from deepspeed_zeropp.simulate import config as configs, link as links, model as models, runner, world
    shape = models.SHAPES[args.model]
    user = configs.read(args.deepspeed_config, shape.width) if args.deepspeed_config else None
    topology = world.Topology(args.gpus_per_node * args.nodes, args.gpus_per_node)
    link = links.Link(links.NVLINK, links.LinkClass(8.0, args.inter_gbps), f"{args.inter_gbps:g} Gbit/s per GPU")
    plan = runner.Plan(shape,
                       topology, {"link": link},
                       tuple(args.configs),
                       steps=args.steps,
                       warmup=1,
                       micro_batch=(user.micro_batch if user and user.micro_batch else 4),
                       profile=False,
                       buckets=user.buckets if user else None)
    world.install(topology.world_size, topology.gpus_per_node, "cuda")
    out = Path(os.environ.get("OUTDIR", "out"))
    out.mkdir(parents=True, exist_ok=True)
    results = {"commit": commit(), "link": link.describe(), "args": vars(args), "configs": {}}
    for key in args.configs:
        print(f"[backpressure] building {key}", flush=True)
        engine, info = runner._build_and_warm(key, plan)
        runner.set_patch(runner.CONFIGS[key])
        defaults = (getattr(coordinators(engine)[0], FETCH_LIMIT), engine.optimizer.max_param_reduce_events)
        found = {name: {"step_ms": [], "waits_per_step": [], "peak_gb": []} for name in args.variants}
        sites = {name: collections.Counter() for name in args.variants}
        index = info["step_index"]
        try:
            for r in range(args.rounds):
                for name in args.variants:
                    set_limits(engine, defaults, *VARIANTS[name])
                    world.set_link(link)
                    runner.step(engine, shape, plan.micro_batch, index)  # untimed: the limits' first step
                    index += 1
                    torch.cuda.synchronize()
                    torch.cuda.reset_peak_memory_stats()
                    waits = Waits()
                    try:
                        times = [runner.step(engine, shape, plan.micro_batch, index + i)[1] for i in range(args.steps)]
                    finally:
                        waits.restore()
                    index += args.steps
                    found[name]["step_ms"].append(statistics.median(times))
                    found[name]["waits_per_step"].append(sum(waits.sites.values()) / args.steps)
                    found[name]["peak_gb"].append(torch.cuda.max_memory_allocated() / 2**30)
                    sites[name].update(waits.sites)
                    print(
                        f"[backpressure] {key} round {r + 1} {name}: {statistics.median(times):.0f} ms, "
                        f"{sum(waits.sites.values()) / args.steps:.0f} waits a step",
                        flush=True)
            for name in args.variants:
                found[name]["sites_per_step"] = {
                    k: v / args.steps / args.rounds
                    for k, v in sites[name].most_common(8)
                }
                base = found["deepspeed"]["step_ms"] if "deepspeed" in found else None
                if base and name != "deepspeed":
                    found[name]["speedup_per_round"] = [b / t for b, t in zip(base, found[name]["step_ms"])]
            results["configs"][key] = found
            if args.dump:
                set_limits(engine, defaults, None, None)
                dump_timeline(engine, plan, index, out / f"timeline_{key}.json.gz")
        finally:
            world.set_link(None)
            runner.set_patch(None)
            runner.release(engine)
        (out / "backpressure.json").write_text(json.dumps(results, indent=1))
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
