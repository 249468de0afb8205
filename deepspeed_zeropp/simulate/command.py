"""``python -m deepspeed_zeropp simulate``: does ZeRO++ pay off on my cluster? One GPU runs rank 0 of the job the
user describes (model shape, GPUs per node, nodes, link speeds), every ZeRO++ configuration side by side, and the
step time of each is printed with the flags of the fastest."""
import json
import os
import sys
import time

MODEL_FLAGS = ("layers", "width", "heads", "vocab", "seq")


def add_arguments(parser):
    from .model import SHAPES
    from .runner import CONFIGS
    parser.add_argument("--model", choices=sorted(SHAPES), default="gpt-1.4b", help="a named GPT shape")
    for flag in MODEL_FLAGS:
        parser.add_argument(f"--{flag}", type=int, help=f"GPT {flag} (overrides --model's)")
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--inter-gbps",
                        type=float,
                        nargs="*",
                        default=[100.0],
                        help="inter-node bandwidth per GPU (its own NIC), Gbit/s; several values: one run each")
    parser.add_argument("--inter-alpha-us", type=float, default=8.0, help="inter-node latency per ring hop, us")
    parser.add_argument("--intra-gbps", type=float, help="intra-node (NVLink) bandwidth per GPU, Gbit/s")
    parser.add_argument("--free", action="store_true", help="also measure with collectives free (host work only)")
    parser.add_argument("--configs", nargs="+", choices=list(CONFIGS), default=list(CONFIGS))
    parser.add_argument("--reps", type=int, default=3, help="interleaved repetitions")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per link and repetition")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--reuse-distance", type=int, help="DeepSpeed's stage3_max_reuse_distance")
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    parser.add_argument("--no-profile", action="store_true", help="skip the profiled steps (kernel time, launches)")
    parser.add_argument("--json", help="also write every figure to this file (after every repetition)")


def plan_from(args):
    import torch
    from . import link as links, model, runner, world
    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    base = model.SHAPES[args.model]
    shape = base._replace(**{f: getattr(args, f) for f in MODEL_FLAGS if getattr(args, f) is not None})
    topology = world.Topology(args.gpus_per_node * args.nodes, args.gpus_per_node)
    topology.check()
    if device == "cuda" and not args.free and not args.inter_gbps:
        raise ValueError("nothing to measure: give --inter-gbps (one or more link speeds) or --free")
    bad = [g for g in args.inter_gbps + [args.intra_gbps or 1] if g <= 0]
    if bad:
        raise ValueError(f"link speeds must be positive Gbit/s, got {bad}")
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
    return runner.Plan(shape,
                       topology,
                       named,
                       tuple(args.configs),
                       reps=args.reps,
                       steps=args.steps,
                       warmup=args.warmup,
                       micro_batch=args.micro_batch,
                       device=device,
                       profile=not args.no_profile,
                       reuse_distance=args.reuse_distance), device


def run(args):
    if args.device == "cpu" or (args.device == "auto" and not _has_cuda()):
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    from . import report, runner, world
    try:
        plan, device = plan_from(args)
    except ValueError as error:
        print(f"[simulate] error: {error}")
        return 2
    started = time.monotonic()
    print(
        f"[simulate] rank 0 of {plan.topology.world_size} ({plan.topology.nodes} nodes x "
        f"{plan.topology.gpus_per_node} GPUs) on {device}: GPT {plan.shape.layers} x {plan.shape.width}, "
        f"{plan.shape.parameters / 1e9:.2f}B parameters; links: {', '.join(plan.links)}",
        flush=True)
    world.install(plan.topology.world_size, plan.topology.gpus_per_node, device)

    def progress(message):
        print(f"[simulate {time.monotonic() - started:5.0f} s] {message}", flush=True)

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
    return 0


def _has_cuda():
    import torch
    return torch.cuda.is_available()


if __name__ == "__main__":
    import argparse
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    sys.exit(run(parser.parse_args()))
