"""Where a ZeRO-3 step's host time goes, per configuration: rank 0 of a simulated world (deepspeed_zeropp.simulate),
collectives free, each configuration's steps under cProfile, the functions compared by their own time and by the
time spent under them. The step is host-bound (benchmarks/results/simulated_world.md), so what the quantized path
adds to the host is what it adds to the step.

    python benchmarks/host_profile.py [--configs unquantized ours-qwz upstream-qwz] [--steps 3] [--out DIR]
writes host_profile.md (the top functions per configuration, and the totals of this package's and DeepSpeed's
functions).
"""
import argparse
import cProfile
import io
import pstats
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from deepspeed_zeropp.simulate import model, runner, world  # noqa: E402
from deepspeed_zeropp.teardown import release  # noqa: E402
from benchmarks.common import commit  # noqa: E402

TOP = 25


def _folders():
    """(area, folder) in the order a file is matched: the simulated world is part of the package's tree."""
    import deepspeed
    import deepspeed_zeropp
    return (("simulated world", Path(world.__file__).parent), ("deepspeed_zeropp",
                                                               Path(deepspeed_zeropp.__file__).parent),
            ("deepspeed", Path(deepspeed.__file__).parent), ("torch (Python)", Path(torch.__file__).parent))


def _area(filename, folders):
    for area, folder in folders:
        if filename.startswith(str(folder) + "/"):
            return area
    return "built-in / C" if filename.startswith(("~", "<")) else "other"


AREAS = ("deepspeed_zeropp", "deepspeed", "torch (Python)", "simulated world", "built-in / C", "other")


def profile(key, engine, plan, first):
    runner.set_patch(runner.CONFIGS[key])
    runner.step(engine, plan.shape, plan.micro_batch, first)
    torch.cuda.synchronize()
    profiler = cProfile.Profile()
    profiler.enable()
    for i in range(plan.steps):
        runner.step(engine, plan.shape, plan.micro_batch, first + 1 + i)
    profiler.disable()
    stats = pstats.Stats(profiler)
    total = sum(row[2] for row in stats.stats.values())
    areas, folders = {}, _folders()
    for (filename, _, _), row in stats.stats.items():
        area = _area(filename, folders)
        areas[area] = areas.get(area, 0.0) + row[2]
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(TOP)
    cumulative = io.StringIO()
    pstats.Stats(profiler, stream=cumulative).sort_stats("cumulative").print_stats(TOP)
    pstats.Stats(profiler, stream=cumulative).sort_stats("cumulative").print_stats("deepspeed_zeropp/(?!simulate)",
                                                                                   TOP)
    own, under = text.getvalue(), cumulative.getvalue()
    for _, folder in folders:  # file names from the package's folder on, not the machine's paths
        own, under = (t.replace(str(folder.parent) + "/", "") for t in (own, under))
    return total / plan.steps, {k: v / plan.steps for k, v in areas.items()}, own, under


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", nargs="+", default=["unquantized", "ours-qwz", "upstream-qwz"])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    args = parser.parse_args()
    topology = world.Topology(args.gpus_per_node * args.nodes, args.gpus_per_node)
    plan = runner.Plan(model.SHAPES["gpt-1.4b"], topology, {"free": None}, tuple(args.configs), steps=args.steps)
    world.install(topology.world_size, topology.gpus_per_node, "cuda")
    world.set_link(None)
    lines = [
        f"# Host time per step, by configuration (cProfile; rank 0 of {topology.world_size}, GPT 1.4B, collectives "
        f"free, {args.steps} steps each)", "", f"Commit {commit()}. Milliseconds per step of each area's own "
        "function time, under "
        "cProfile (which slows Python calls, so compare rows, not with step times elsewhere). The step waits for the GPU "
        "inside `loss.item()`, counted under built-in / C; the simulated world's process group stands in for NCCL's.",
        "", "| configuration | all | " + " | ".join(AREAS) + " |", "|---|---|" + "---|" * len(AREAS)
    ]
    details = []
    engines = {}
    try:
        for key in args.configs:
            engines[key], _ = runner._build_and_warm(key, plan)
        for key in args.configs:
            total, areas, own, cumulative = profile(key, engines[key], plan, 1000)
            cells = " | ".join(f"{areas.get(a, 0.0) * 1e3:.0f} ms" for a in AREAS)
            lines.append(f"| {runner.CONFIGS[key].label} | {total * 1e3:.0f} ms | {cells} |")
            details += [f"## {runner.CONFIGS[key].label}", "", "```", own.strip(), "", cumulative.strip(), "```", ""]
    finally:
        runner.set_patch(None)
        for engine in engines.values():
            release(engine)
    args.out.mkdir(parents=True, exist_ok=True)
    text = "\n".join(lines + [""] + details) + "\n"
    (args.out / "host_profile.md").write_text(text)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
