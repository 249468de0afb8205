"""Python and C calls per ZeRO-3 step, by area: an exact count of the host work a configuration adds.

Host time on a shared machine varies by tens of percent from run to run; the number of calls a step makes does
not. Each world size runs in a process of its own as rank 0 of a simulated world on the CPU
(``deepspeed_zeropp.simulate``, collectives free, the pure-torch backend), a small GPT, the HF Trainer's "auto"
buckets; every configuration trains one untimed step, then ``--steps`` steps under cProfile, which counts every
Python function call and every C function called from Python.

    python benchmarks/host_calls.py [--world-sizes 8 64] [--configs unquantized ours-qwz ours-qwz-qgz] [--steps 2]
writes results/host_calls.md and results/host_calls.json. Upstream's quantizer op has no CPU build: with
``--device cuda`` the same count runs on a GPU (our CUDA backend, DeepSpeed's op for upstream; the collectives
still free), where ``upstream-qwz`` can be counted too, into results/host_calls_cuda.md and .json.

hpZ configurations (``ours-qwz-qgz-hpz``, ``...-step-writes``) run with ``stage3_max_reuse_distance`` 0, so that
their backward re-fetches read the node-local copy at this model's size (the others keep DeepSpeed's default).
"""
import argparse
import cProfile
import json
import os
import pstats
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import commit, per_world_size  # noqa: E402

SHAPE = dict(layers=4, width=256, heads=4, vocab=1024, seq=64)  # small: the counts, not the arithmetic, matter
WHERE = {"cpu": "the CPU (pure-torch backend)", "cuda": "one GPU (our CUDA backend; upstream: DeepSpeed's op)"}
TOP = 12  # files of the package (and tensor methods) listed by their difference to the first configuration


def _area(filename, name, folders):
    """The area of a cProfile row: a folder of the package or a library, or a built-in by the name it has."""
    for area, folder in folders:
        if filename.startswith(str(folder) + "/"):
            return area, filename[len(str(folder.parent)) + 1:]
    if filename.startswith(("~", "<")):
        return "built-in / C", name
    return "other", filename


def count(keys, world_size, steps, device="cpu"):
    """{key: {"total": calls per step, "areas": {...}, "detail": {file or built-in: calls per step}}}: rank 0 of
    ``world_size`` ranks on 2 nodes (DeepSpeed's CPU communication op waits for the peers of a one-node job on the
    host, which a simulated world does not have; qwZ gathers over all ranks either way)."""
    import torch
    import deepspeed
    import deepspeed_zeropp
    from deepspeed_zeropp.simulate import model, runner, world
    folders = (("simulated world", Path(world.__file__).parent), ("deepspeed_zeropp",
                                                                  Path(deepspeed_zeropp.__file__).parent),
               ("deepspeed", Path(deepspeed.__file__).parent), ("torch (Python)", Path(torch.__file__).parent))
    topology = world.Topology(world_size, world_size // 2)
    shape = model.Shape(**SHAPE)
    plan = runner.Plan(shape,
                       topology, {"free": None},
                       tuple(keys),
                       steps=steps,
                       warmup=1,
                       device=device,
                       dtype=torch.bfloat16,
                       micro_batch=2,
                       profile=False)
    world.install(world_size, topology.gpus_per_node, device)
    world.set_link(None)
    results, engines = {}, {}
    try:
        for key in keys:  # hpZ's node-local copy is only read where weights are released between uses
            hpz = runner.CONFIGS[key].zero.get("hpz")
            engines[key], _ = runner._build_and_warm(key, plan._replace(reuse_distance=0) if hpz else plan)
        for key in keys:
            runner.set_patch(runner.CONFIGS[key])
            runner.step(engines[key], shape, plan.micro_batch, 100)
            profiler = cProfile.Profile()
            profiler.enable()
            for i in range(steps):
                runner.step(engines[key], shape, plan.micro_batch, 101 + i)
            profiler.disable()
            phases = _by_phase(engines[key], shape, plan.micro_batch, 101 + steps, steps)
            areas, detail = {}, {}
            for (filename, _, name), row in pstats.Stats(profiler).stats.items():
                area, where = _area(filename, name, folders)
                areas[area] = areas.get(area, 0) + row[1]
                if area in ("deepspeed_zeropp", "built-in / C"):
                    detail[where] = detail.get(where, 0) + row[1]
            results[key] = {
                "total": sum(areas.values()) / steps,
                "areas": {
                    k: v / steps
                    for k, v in areas.items()
                },
                "detail": {
                    k: v / steps
                    for k, v in detail.items()
                },
                "phases": phases,
            }
    finally:
        runner.set_patch(None)
        for engine in engines.values():
            runner.release(engine)
    return results


def _by_phase(engine, shape, micro_batch, first, steps):
    """{phase: calls per step} over ``steps`` more steps, counted within each phase of the step (forward, backward,
    the optimizer step with the loss's wait: runner.step's marks), by a profiler of its own per phase (one profiler
    runs at a time, so these steps are not the whole-step count's)."""
    import contextlib
    from deepspeed_zeropp.simulate import runner, timeline
    profilers = {phase: cProfile.Profile() for phase in timeline.PHASES}

    @contextlib.contextmanager
    def mark(name):
        profiler = profilers[name[len(timeline.PHASE_MARK):]]
        profiler.enable()
        try:
            yield
        finally:
            profiler.disable()

    for i in range(steps):
        runner.step(engine, shape, micro_batch, first + i, mark=mark)
    return {
        phase: sum(row[1] for row in pstats.Stats(profiler).stats.values()) / steps
        for phase, profiler in profilers.items()
    }


def _markdown(results, keys, steps, commit_id, device):
    from deepspeed_zeropp.simulate import runner
    areas = ("deepspeed_zeropp", "deepspeed", "torch (Python)", "simulated world", "built-in / C", "other")
    lines = [
        "# Python and C calls per ZeRO-3 step", "", f"Commit {commit_id}. Rank 0 of a simulated world on "
        f"{WHERE[device]} (2 nodes, collectives free), GPT {SHAPE}, micro-batch 2, the HF Trainer's "
        f"\"auto\" buckets, bf16; cProfile's call counts over {steps} steps after one untimed step "
        f"(`python benchmarks/host_calls.py --device {device}`). Counts are exact: the same tree and the same "
        "--configs give the same figures (each engine built in the process moves DeepSpeed's own counts a "
        "little).", "", "| ranks | configuration | calls per step | vs " + runner.CONFIGS[keys[0]].label + " | " +
        " | ".join(areas) + " |", "|---|---|---|---|" + "---|" * len(areas)
    ]
    for world_size, by_key in results.items():
        base = by_key[keys[0]]["total"]
        for key in keys:
            row = by_key[key]
            cells = " | ".join(f"{row['areas'].get(a, 0):,.0f}" for a in areas)
            lines.append(f"| {world_size} | {runner.CONFIGS[key].label} | {row['total']:,.0f} | "
                         f"{row['total'] / base - 1:+.1%} | {cells} |")
    phases = ("forward", "backward", "step")
    lines += [
        "", "By phase (calls per step within forward, backward and the optimizer step, counted over as many more "
        "steps):", "", "| ranks | configuration | " + " | ".join(phases) + " |", "|---|---|" + "---|" * len(phases)
    ]
    for world_size, by_key in results.items():
        for key in keys:
            found = by_key[key].get("phases", {})
            lines.append(f"| {world_size} | {runner.CONFIGS[key].label} | " +
                         " | ".join(f"{found[p]:,.0f}" if p in found else "-" for p in phases) + " |")
    for world_size, by_key in results.items():
        base = by_key[keys[0]]["detail"]
        for key in keys[1:]:
            detail = by_key[key]["detail"]
            moved = sorted(set(base) | set(detail), key=lambda k: -abs(detail.get(k, 0) - base.get(k, 0)))[:TOP]
            lines += [
                "", f"{world_size} ranks, {runner.CONFIGS[key].label} against {runner.CONFIGS[keys[0]].label}: the "
                "package's files and the built-ins that moved most (calls per step)", "",
                "| where | " + runner.CONFIGS[keys[0]].label + " | " + runner.CONFIGS[key].label + " | difference |",
                "|---|---|---|---|"
            ]
            lines += [
                f"| `{k}` | {base.get(k, 0):,.0f} | {detail.get(k, 0):,.0f} | {detail.get(k, 0) - base.get(k, 0):+,.0f} |"
                for k in moved
            ]
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--configs", nargs="+", default=["unquantized", "ours-qwz", "ours-qwz-qgz"])
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # a child process: one world size, JSON out
    args = parser.parse_args()
    if args.one:
        print(json.dumps(count(args.configs, args.one, args.steps, args.device)))
        return
    env = dict(os.environ, **({"DS_ACCELERATOR": "cpu"} if args.device == "cpu" else {}))
    results = per_world_size(
        __file__, args.world_sizes,
        ["--steps", str(args.steps), "--device", args.device, "--configs", *args.configs], env)
    commit_id = commit()
    args.out.mkdir(parents=True, exist_ok=True)
    name = "host_calls" if args.device == "cpu" else "host_calls_cuda"
    (args.out / f"{name}.json").write_text(json.dumps({"commit": commit_id, "results": results}, indent=1))
    text = _markdown(results, args.configs, args.steps, commit_id, args.device)
    (args.out / f"{name}.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
