"""The link model's time per ZeRO-3 step, from the collectives one step really makes: exact, on a CPU.

Rank 0 of a simulated world on the CPU (``deepspeed_zeropp.simulate``) trains one untimed step and then one logged
step of each configuration; every collective's kind, size, group and the nodes it spans is kept with the phase that
issued it (forward, backward, the optimizer step), and the step's link time is summed under each link
(``deepspeed_zeropp/simulate/link.py``), beside the same collectives under the model before "a ring across nodes
sends through every NIC of a node" (one GPU's NIC for the whole ring, every hop inter-node). The collectives depend
on the model's weights and the bucket sizes, not on the batch, so the model runs 16 tokens a sequence on the CPU
(its positional table is then 16 rows, not 1024: a few MB less gathered).

    python benchmarks/link_budget.py [--model gpt-7b] [--gpus-per-node 8] [--nodes 8] [--inter-gbps 12.5 50 100]
        [--deepspeed-config benchmarks/configs/gpt7b_tuned.json] [--configs unquantized ours-qwz-qgz ...]
writes results/link_budget_<model>_<nodes>x<gpus>.json and .md.
"""
import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import commit  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def log_steps(keys, shape, topology, buckets):
    """{key: {phase: [(kind, bytes, ranks, link class, nodes), ...]}}: the collectives of one step of each
    configuration, by the phase of the step that issued them (forward, backward, the optimizer step)."""
    import contextlib
    import torch
    from deepspeed_zeropp.simulate import runner, timeline, world
    plan = runner.Plan(shape,
                       topology, {"free": None},
                       tuple(keys),
                       steps=1,
                       warmup=1,
                       device="cpu",
                       dtype=torch.bfloat16,
                       micro_batch=1,
                       profile=False,
                       buckets=buckets)
    world.install(topology.world_size, topology.gpus_per_node, "cpu")
    world.set_link(None)
    logged, engines = {}, {}
    try:
        for key in keys:
            engines[key], _ = runner._build_and_warm(key, plan)
            runner.set_patch(runner.CONFIGS[key])
            world.STATE.log = []
            phases = {}

            @contextlib.contextmanager
            def mark(name):
                start = len(world.STATE.log)
                yield
                phases[name[len(timeline.PHASE_MARK):]] = world.STATE.log[start:]

            runner.step(engines[key], shape, 1, 100, mark=mark)
            logged[key] = phases
            world.STATE.log = None
            runner.set_patch(None)
            runner.release(engines.pop(key))
    finally:
        world.STATE.log = None
        runner.set_patch(None)
        for engine in engines.values():
            runner.release(engine)
    return logged


def budget(collectives, model, old=False):
    """{link class: ms} of ``collectives`` under ``model`` (a link.Link); ``old``: every inter-node group as if
    it had one rank per node (the model before rings used every NIC of a node)."""
    found = {}
    for kind, nbytes, n, link_class, nodes in collectives:
        seconds = model.seconds(kind, nbytes, n, link_class, n if old else nodes)
        found[link_class] = found.get(link_class, 0) + seconds * 1e3
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt-7b")
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--inter-gbps", type=float, nargs="+", default=[12.5, 50.0, 100.0])
    parser.add_argument("--deepspeed-config",
                        default="benchmarks/configs/gpt7b_tuned.json",
                        help="its zero_optimization sizes; '' for the HF Trainer's \"auto\"")
    parser.add_argument("--configs", nargs="+", default=["unquantized", "ours-qwz-qgz", "ours-qwz-qgz-hpz"])
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    from deepspeed_zeropp.simulate import config, link, model, world
    shape = model.SHAPES[args.model]._replace(seq=16)
    topology = world.Topology(args.nodes * args.gpus_per_node, args.gpus_per_node)
    buckets = config.read(args.deepspeed_config, shape.width).buckets if args.deepspeed_config else None
    logged = log_steps(args.configs, shape, topology, buckets)
    rows = {}
    for key, phases in logged.items():
        every = [c for collectives in phases.values() for c in collectives]
        rows[key] = {"collectives": len(every), "links": {}}
        for gbps in args.inter_gbps:
            chosen = link.Link(link.NVLINK, link.LinkClass(8.0, gbps))
            rows[key]["links"][f"{gbps:g}"] = {
                "now": budget(every, chosen),
                "before": budget(every, chosen, old=True),
                "now_by_phase": {
                    phase: budget(c, chosen)
                    for phase, c in phases.items()
                },
            }
    name = f"link_budget_{args.model}_{args.nodes}x{args.gpus_per_node}"
    found = {
        "commit": commit(),
        "model": args.model,
        "topology": [args.nodes, args.gpus_per_node],
        "buckets": buckets,
        "rows": rows
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{name}.json").write_text(json.dumps(found, indent=1))
    lines = [
        f"# The link model's time per step: {args.model}, {args.nodes} nodes x {args.gpus_per_node}", "",
        f"Commit {found['commit']}; `python benchmarks/link_budget.py` (one CPU step's collectives, exact); sizes "
        f"{buckets or 'the HF Trainer auto'}. ms per step, inter-node / NVLink, now and under the model before "
        "rings used every NIC of a node.", "",
        "| configuration | collectives | " + " | ".join(f"{g:g} Gbit/s per GPU ({g * args.gpus_per_node:g} a node): "
                                                        "now | before" for g in args.inter_gbps) + " |",
        "|---|---|" + "---|---|" * len(args.inter_gbps)
    ]
    for key, row in rows.items():
        cells = []
        for gbps in args.inter_gbps:
            pair = row["links"][f"{gbps:g}"]
            cells += [
                " / ".join(f"{pair[when].get(c, 0):.0f}" for c in ("inter", "intra")) for when in ("now", "before")
            ]
        lines.append(f"| {key} | {row['collectives']} | " + " | ".join(cells) + " |")
    lines += [
        "", "Now, by the phase that issued the collectives (ms per step, inter-node and NVLink together): forward's "
        "all-gathers need the weights the last optimizer step wrote, so they can only hide behind forward's own "
        "work.", "", "| configuration | " + " | ".join(f"{g:g} Gbit/s per GPU: forward / backward / step"
                                                       for g in args.inter_gbps) + " |",
        "|---|" + "---|" * len(args.inter_gbps)
    ]
    for key, row in rows.items():
        cells = [
            " / ".join(f"{sum(row['links'][f'{g:g}']['now_by_phase'].get(p, {}).values()):.0f}"
                       for p in ("forward", "backward", "step")) for g in args.inter_gbps
        ]
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
    (args.out / f"{name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
