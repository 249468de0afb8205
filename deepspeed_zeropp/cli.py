"""Command line: ``python -m deepspeed_zeropp doctor | demo | simulate`` (also ``deepspeed-zeropp``).

The kernel benchmarks are scripts of the repository (``benchmarks/``), not commands of the package."""
import argparse
import sys


def main(argv=None):
    parser = argparse.ArgumentParser(prog="deepspeed_zeropp",
                                     description="ZeRO-3 quantized weights that keep every parameter's dtype")
    commands = parser.add_subparsers(dest="command", required=True)
    doctor = commands.add_parser("doctor", help="check this environment and the patch, with advice")
    doctor.add_argument("--backend", default="auto")
    demo = commands.add_parser("demo",
                               help="2-rank ZeRO-3 bf16 training with zero_quantized_weights, both ways "
                               "(needs deepspeed_zeropp[demo])")
    demo.add_argument("--steps", type=int, default=5)
    demo.add_argument("--device", choices=["auto", "cpu", "cuda-shared"], default="auto")
    simulate = commands.add_parser("simulate",
                                   help="ZeRO-3 step time of each ZeRO++ configuration on a cluster you describe, "
                                   "measured as rank 0 of it on this GPU; --search: the fastest zero_optimization "
                                   "block")
    from .simulate import arguments as simulate_arguments, command as simulate_command
    simulate_arguments.add_arguments(simulate)
    args = parser.parse_args(argv)
    if args.command == "doctor":
        from .doctor import run
        return run(backend=args.backend)
    if args.command == "demo":
        from .demo import run
        return run(steps=args.steps, device=args.device)
    return simulate_command.run(args)


if __name__ == "__main__":
    sys.exit(main())
