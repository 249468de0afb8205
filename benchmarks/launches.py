"""Kernel launches per ZeRO-3 step, counted exactly on the CPU: what a configuration would launch on a GPU, by op.

A profiled GPU step gives one launch count, at one world size, on the machine that is lent. This counts the same
thing without a GPU, by what each op of the step is: rank 0 of a simulated world (``deepspeed_zeropp.simulate``,
collectives free), every ATen op the step dispatches counted under a dispatch mode unless it launches nothing on a
GPU (views, allocations, metadata), every collective one launch (NCCL's one kernel), and every call into the
quantization backend one launch (the CUDA backend's one kernel per call; its bucket wait writes parts in place
where its ``WRITES_PARTS`` says so, and the count follows that switch; its batches of quantizes hold at most
``MAX_SEGMENTS`` partitions, as here). The ops inside collectives and backend calls are not counted again. What
the CPU world cannot tell apart: an op that a GPU job would run on a host tensor counts as a launch too.
Upstream's quantizer op has no CPU build, so its configurations cannot be counted here.

The model is the simulated world's 1.4B GPT (``gpt-1.4b``: its parameters, so its fetches, buckets and
DeepSpeed's releases and re-fetches are the GPU run's) at DeepSpeed's default ``stage3_max_reuse_distance``, fed
micro-batches of one sequence of ``TOKENS`` tokens: the ops a step launches do not depend on how many tokens they
read, and the CPU's arithmetic stays short.

    python benchmarks/launches.py [--world-sizes 8 64] [--configs unquantized ours-qwz ours-qwz-qgz] [--steps 1]
writes results/launches.md and results/launches.json. Counts are exact: the same tree gives the same figures.
"""
import argparse
import collections
import contextlib
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import commit, per_world_size  # noqa: E402

MODEL = "gpt-1.4b"  # the simulated world's shape (simulate/model.py), as the GPU's profiled steps run it
TOKENS = 64  # tokens per sequence fed (the model keeps its positions); launches do not depend on it
# ATen ops that launch nothing on a GPU besides views: allocation, metadata, stream bookkeeping
NO_LAUNCH = frozenset(("empty", "empty_strided", "empty_like", "new_empty", "new_empty_strided", "set_", "resize_",
                       "record_stream", "lift_fresh", "detach", "alias", "_unsafe_view", "view"))
BACKEND_FUNCTIONS = ("quantize", "quantize_into", "quantize_many_into", "dequantize", "dequantize_ranks",
                     "dequantize_parts_into", "qgz_encode", "qgz_reduce_encode", "qgz_decode_sum")
TOP = 12  # ops listed by their difference to the first configuration


def launches(func):
    """Whether the ATen op ``func`` launches work on a GPU."""
    return not (func.is_view or func.overloadpacket.__name__ in NO_LAUNCH)


class Counter:
    """Launches by phase and by op while on; :meth:`outside` stops counting for what one launch already covers."""

    def __init__(self):
        self.by_phase = collections.defaultdict(collections.Counter)
        self.phase = None
        self._paused = 0

    def add(self, name):
        if self.phase is not None and not self._paused:
            self.by_phase[self.phase][name] += 1

    @contextlib.contextmanager
    def outside(self, name):
        self.add(name)
        self._paused += 1
        try:
            yield
        finally:
            self._paused -= 1

    @contextlib.contextmanager
    def in_phase(self, mark):
        from deepspeed_zeropp.simulate import timeline
        self.phase = mark[len(timeline.PHASE_MARK):]
        try:
            yield
        finally:
            self.phase = None


def _mode(counter):
    from torch.utils._python_dispatch import TorchDispatchMode

    class Launches(TorchDispatchMode):

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if launches(func):
                counter.add(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    return Launches()


def _wrap(owner, name, counter, label):
    original = getattr(owner, name)

    def wrapper(*args, **kwargs):
        with counter.outside(label):
            return original(*args, **kwargs)

    setattr(owner, name, wrapper)


def count(keys, world_size, steps):
    """Rank 0 of ``world_size`` ranks on 2 nodes (as host_calls.py): ``launches``, {key: {phase: {op: launches per
    step}}}, and ``past_forward``, {key: the packets each forward keeps for its backward and their MiB, per step}."""
    import torch
    from deepspeed_zeropp import ops
    from deepspeed_zeropp.backends import cuda, torch_ref
    from deepspeed_zeropp.patching.seams import fetch
    from deepspeed_zeropp.simulate import model, runner, world
    counter = Counter()
    kept = {"packets": 0, "bytes": 0}
    keep_released = fetch._keep_released

    def counting_kept():  # the packets a forward keeps for its backward, as it returns
        keep_released()
        kept["packets"] += len(fetch.KEPT.packets)
        kept["bytes"] += sum(packet[3][0].untyped_storage().nbytes() for packet in fetch.KEPT.packets.values())

    fetch._keep_released = counting_kept
    for name in BACKEND_FUNCTIONS:
        _wrap(torch_ref, name, counter, f"backend.{name}")
    _wrap(world.SimulatedGroup, "_run", counter, "collective")
    ops.forget_signatures()
    topology = world.Topology(world_size, world_size // 2)
    shape = model.SHAPES[MODEL]
    fed = shape._replace(seq=TOKENS)
    plan = runner.Plan(shape,
                       topology, {"free": None},
                       tuple(keys),
                       steps=steps,
                       warmup=0,
                       device="cpu",
                       dtype=torch.bfloat16,
                       micro_batch=1,
                       profile=False)
    world.install(world_size, topology.gpus_per_node, "cpu")
    world.set_link(None)
    results, past_forward, engines = {}, {}, {}
    try:
        for key in keys:
            engines[key], _ = runner._build_and_warm(key, plan)
        for key in keys:
            runner.set_patch(runner.CONFIGS[key])
            torch_ref.WRITES_PARTS = cuda.WRITES_PARTS  # as the CUDA backend's bucket waits run
            torch_ref.MAX_SEGMENTS = cuda.MAX_SEGMENTS  # and its batches of quantizes, one kernel per call
            for i in range(2):  # uncounted: the first steps set up the optimizer's and the fetches' state
                runner.step(engines[key], fed, plan.micro_batch, 100 + i)
            counter.by_phase.clear()
            kept.update(packets=0, bytes=0)
            with _mode(counter):
                for i in range(steps):
                    runner.step(engines[key], fed, plan.micro_batch, 102 + i, mark=counter.in_phase)
            results[key] = {
                phase: {
                    op: n / steps
                    for op, n in sorted(ops_.items())
                }
                for phase, ops_ in counter.by_phase.items()
            }
            past_forward[key] = {"packets": kept["packets"] / steps, "mib": kept["bytes"] / steps / 2**20}
    finally:
        fetch._keep_released = keep_released
        runner.set_patch(None)
        torch_ref.WRITES_PARTS = False
        torch_ref.__dict__.pop("MAX_SEGMENTS", None)
        for engine in engines.values():
            runner.release(engine)
    return {"launches": results, "past_forward": past_forward}


def total(by_phase, phase=None):
    return sum(n for p, ops_ in by_phase.items() if phase in (None, p) for n in ops_.values())


def _markdown(results, keys, steps, commit_id):
    from deepspeed_zeropp.simulate import model, runner
    phases = ("forward", "backward", "step")
    label = {key: runner.CONFIGS[key].label for key in keys}
    lines = [
        "# Kernel launches per ZeRO-3 step, counted on the CPU", "", f"Commit {commit_id}. Rank 0 of a simulated "
        f"world on the CPU (2 nodes, collectives free), the {MODEL} GPT ({model.SHAPES[MODEL]}) fed micro-batches "
        f"of one {TOKENS}-token sequence, the HF Trainer's \"auto\" buckets, DeepSpeed's default "
        f"stage3_max_reuse_distance, bf16; every op that would launch a kernel on a GPU counted over {steps} step(s) "
        "after two uncounted ones, each "
        "collective and each quantization backend call as one launch (`python benchmarks/launches.py`). Exact: "
        "the same tree gives the same figures.", "",
        "Packets kept for backward: those each forward keeps for the backward after it (the weights DeepSpeed "
        "released in forward, `patching/seams/fetch.py`), as it returns, and their size.", "",
        "| ranks | configuration | launches per step | vs " + label[keys[0]] + " | " + " | ".join(phases) +
        " | packets kept for backward |", "|---|---|---|---|" + "---|" * len(phases) + "---|"
    ]
    for world_size, counted in results.items():
        by_key, kept = counted["launches"], counted["past_forward"]
        base = total(by_key[keys[0]])
        for key in keys:
            found = by_key[key]
            cells = [world_size, label[key], f"{total(found):,.0f}", f"{total(found) / base - 1:+.1%}"]
            cells += [f"{total(found, p):,.0f}" for p in phases]
            cells.append(f"{kept[key]['packets']:.0f} ({kept[key]['mib']:.1f} MiB)")
            lines.append("| " + " | ".join(map(str, cells)) + " |")
    for world_size, counted in results.items():
        by_key = counted["launches"]
        merged = {key: collections.Counter() for key in keys}
        for key in keys:
            for ops_ in by_key[key].values():
                merged[key].update(ops_)
        for key in keys[1:]:
            base, mine = merged[keys[0]], merged[key]
            moved = sorted(set(base) | set(mine), key=lambda op: (-abs(mine[op] - base[op]), op))[:TOP]
            lines += [
                "", f"{world_size} ranks, {label[key]} against {label[keys[0]]}: the launches that moved most, by op",
                "", f"| op | {label[keys[0]]} | {label[key]} | difference |", "|---|---|---|---|"
            ]
            lines += [
                f"| `{op}` | {base[op]:,.0f} | {mine[op]:,.0f} | {mine[op] - base[op]:+,.0f} |" for op in moved
                if mine[op] != base[op]
            ]
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--configs", nargs="+", default=["unquantized", "ours-qwz", "ours-qwz-qgz"])
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # a child process: one world size, JSON out
    args = parser.parse_args()
    if args.one:
        print(json.dumps(count(args.configs, args.one, args.steps)))
        return
    results = per_world_size(__file__,
                             args.world_sizes, ["--steps", str(args.steps), "--configs", *args.configs],
                             env=dict(os.environ, DS_ACCELERATOR="cpu"))
    commit_id = commit()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "launches.json").write_text(json.dumps({"commit": commit_id, "results": results}, indent=1))
    text = _markdown(results, args.configs, args.steps, commit_id)
    (args.out / "launches.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
