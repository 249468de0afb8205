"""Command line: ``python -m deepspeed_zeropp doctor | demo | simulate | bench`` (also ``deepspeed-zeropp``)."""
import argparse
import sys


def main(argv=None):
    parser = argparse.ArgumentParser(prog="deepspeed_zeropp",
                                     description="ZeRO-3 quantized weights that keep every parameter's dtype")
    commands = parser.add_subparsers(dest="command", required=True)
    doctor = commands.add_parser("doctor", help="check this environment and the patch, with advice")
    doctor.add_argument("--backend", default="auto")
    demo = commands.add_parser("demo", help="2-rank ZeRO-3 bf16 training with zero_quantized_weights, both ways")
    demo.add_argument("--steps", type=int, default=5)
    demo.add_argument("--device", choices=["auto", "cpu", "cuda-shared"], default="auto")
    simulate = commands.add_parser("simulate",
                                   help="ZeRO-3 step time of each ZeRO++ configuration on a cluster you describe, "
                                   "measured as rank 0 of it on this GPU")
    from .simulate import command as simulate_command
    simulate_command.add_arguments(simulate)
    bench = commands.add_parser("bench", help="run the kernel benchmarks (needs a CUDA GPU)")
    bench.add_argument("--out", default="benchmarks/results")
    bench.add_argument("--name", help="file name stem of the results (default: kernels_<gpu>)")
    args = parser.parse_args(argv)
    if args.command == "doctor":
        from .doctor import run
        return run(backend=args.backend)
    if args.command == "demo":
        from .demo import run
        return run(steps=args.steps, device=args.device)
    if args.command == "simulate":
        return simulate_command.run(args)
    from .bench import run
    return run(out=args.out, name=args.name)


if __name__ == "__main__":
    sys.exit(main())
