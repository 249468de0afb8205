"""``python -m deepspeed_zeropp simulate``: does ZeRO++ pay off on my cluster, and with which settings? One GPU runs
rank 0 of the job the user describes (model shape or ``--deepspeed-config``, GPUs per node, nodes, link speeds).

Without ``--search``: every ZeRO++ configuration side by side at one set of zero_optimization sizes (the user's
config's, else the HF Trainer's "auto" ones), the step time of each printed with the flags of the fastest; scripts
(benchmarks/simulated_world.py) run this. With ``--search``: the sizes of each configuration and of unquantized
ZeRO-3 are searched (search.py) within ``--budget-minutes``, and the fastest whole ``zero_optimization`` block that
fits the GPU's memory is printed, with its speed-up against unquantized ZeRO-3 at the user's sizes and at tuned ones.
Every argument is checked before anything is built (arguments.py)."""
import json
import os
import sys
import time

from . import arguments


def plan_from(args, checked):
    """The runs to make, from arguments ``arguments.check`` has accepted."""
    from . import link as links, runner, world
    topology = world.Topology(args.gpus_per_node * args.nodes, args.gpus_per_node)
    device = checked.device
    intra = links.NVLINK if args.intra_gbps is None else links.LinkClass(links.NVLINK.alpha_us, args.intra_gbps)
    named = {"free": None} if args.free or device == "cpu" else {}
    if device == "cuda" and topology.nodes == 1 and args.inter_gbps:  # one node: only NVLink is ever crossed
        named["NVLink"] = links.Link(intra, links.LinkClass(args.inter_alpha_us, args.inter_gbps[0]), "one node")
    elif device == "cuda":
        for gbps in args.inter_gbps:
            named[f"{gbps:g} Gbit/s"] = links.Link(intra, links.LinkClass(args.inter_alpha_us, gbps),
                                                   f"{gbps:g} Gbit/s per GPU across nodes")
    elif args.inter_gbps and not args.free:
        print("[simulate] no CUDA device: link times are modelled on a GPU's timeline only; measuring the free "
              "link (the host's work) instead")
    return runner.Plan(checked.shape,
                       topology,
                       named,
                       checked.keys,
                       reps=args.reps,
                       steps=args.steps,
                       warmup=args.warmup,
                       micro_batch=checked.micro_batch,
                       device=device,
                       profile=not args.no_profile and not args.search,
                       reuse_distance=args.reuse_distance,
                       buckets=checked.user.buckets if checked.user else None)


def run(args):
    if args.device == "cpu" or (args.device == "auto" and not _has_cuda()):
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    from . import report, runner, world
    try:
        checked = arguments.check(args, _has_cuda)
    except arguments.ArgumentError as error:
        print(f"[simulate] error: {error}")
        return 2
    plan = plan_from(args, checked)
    kept, left_out = runner.available(plan.keys, plan.topology, plan.device, plan.shape, plan.reuse())
    if not kept:  # before anything is built, as arguments.check's errors
        print("[simulate] error: --configs %s: none can run in this world (%s); accepted: a configuration this "
              "world can run" % (" ".join(plan.keys), "; ".join(f"{k}: {why}" for k, why in left_out.items())))
        return 2
    device = plan.device
    started = time.monotonic()
    print(
        f"[simulate] rank 0 of {plan.topology.world_size} ({plan.topology.nodes} nodes x "
        f"{plan.topology.gpus_per_node} GPUs) on {device}: GPT {plan.shape.layers} x {plan.shape.width}, "
        f"{plan.shape.parameters / 1e9:.2f}B parameters; links: {', '.join(plan.links)}",
        flush=True)
    if checked.user:
        print(f"[simulate] baseline: {checked.user.path}'s zero_optimization sizes "
              f"{json.dumps(checked.user.buckets)}, micro-batch {plan.micro_batch}")
    world.install(plan.topology.world_size, plan.topology.gpus_per_node, device)

    def progress(message):
        print(f"[simulate {time.monotonic() - started:5.0f} s] {message}", flush=True)

    if args.search:
        return searched(args, checked, plan, progress, started)

    def write(results):
        if args.json:
            table, ratios = report.summary(results)
            with open(args.json + ".tmp", "w") as f:
                json.dump(dict(results, summary=table, ratios=ratios, problems=report.problems(results)), f, indent=1)
            os.replace(args.json + ".tmp", args.json)

    results = runner.run(plan, progress=progress, on_rep=write)
    write(results)
    table, ratios = report.summary(results)
    found = report.problems(results)
    for reason in results["left_out"].items():
        print("[simulate] left out: %s (%s)" % reason)
    for link_name in plan.links:
        print(f"\n{link_name}: {results['links'][link_name]}\n")
        print(report.markdown_table(table, ratios, link_name))
        best, flags = report.recommend(table, link_name)
        print(f"\nfastest: {runner.CONFIGS[best].label}; zero_optimization flags: {json.dumps(flags) or '{}'}")
    if found:
        print("\n[simulate] NOT VALID, runs that cannot be reported:\n  " + "\n  ".join(found))
        return 1
    print(f"\n[simulate] every run: no skipped step, finite losses, its quantized paths ran; "
          f"{time.monotonic() - started:.0f} s")
    others = report.other_cores(results)
    if others is not None and others > report.BUSY_HOST_CORES:
        print(f"[simulate] note: other processes kept up to {others:.1f} cores of this machine busy during the timed "
              "steps; a host-bound step runs slower and varies more than on a machine of its own")
    return 0


def searched(args, checked, plan, progress, started):
    """--search: the sizes of every configuration searched, the fastest block printed (search.py)."""
    from . import runner, search, trials
    keys, left_out = runner.available(plan.keys, plan.topology, plan.device, plan.shape, plan.reuse())
    for reason in left_out.items():
        print("[simulate] left out: %s (%s)" % reason)
    start = plan.buckets if plan.buckets is not None else search.configs.hf_auto(plan.shape.width)
    outcome = search.search(keys,
                            start,
                            checked.grid,
                            list(plan.links),
                            trials.measurer(plan, progress),
                            budget_s=args.budget_minutes * 60,
                            memory_gb=checked.memory_gb,
                            progress=progress)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(search.to_json(outcome), f, indent=1)
    for name, link in plan.links.items():
        print(f"\n[simulate] {name}: {link.describe() if link else 'collectives cost only their copies'}")
    print(search.render(outcome, plan.topology.gpus_per_node, checked.memory_gb, checked.user))
    if any(answer.results[answer.best].problems for answer in outcome.answers):
        print("\n[simulate] NOT VALID: no configuration ran cleanly (see excluded above)")
        return 1
    print(f"[simulate] {time.monotonic() - started:.0f} s in all")
    return 0


def _has_cuda():
    import torch
    return torch.cuda.is_available()


if __name__ == "__main__":
    import argparse
    parser = argparse.ArgumentParser()
    arguments.add_arguments(parser)
    sys.exit(run(parser.parse_args()))
