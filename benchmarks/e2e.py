"""End-to-end ZeRO-3 step time on 2 GPUs as 2 nodes: unquantized vs ours vs upstream's qwZ and qwZ+qgZ.

A GPT-2-architecture model of 1.3B parameters (24 layers, width 2048, vocabulary 50304) in bf16, built partitioned on the GPU under
``zero.Init``, trained with AdamW on the harness's learnable batches (``harness``). Each rank sees
only its own GPU, so DeepSpeed treats the ranks as two nodes and qgZ runs. "upstream" is the installed DeepSpeed
unpatched (its compiled quantizer); "ours" the same DeepSpeed patched. Every repetition is one job that trains the
configurations one after the other (A B C D E, A B C D E, ...), each from the same seed on the same batches; the first
``--warmup`` steps of a run are not timed. Per configuration: the median step time of each repetition, their median,
and their spread (min-max). A ratio between two configurations is taken within each repetition (one job, side by
side): the median of those ratios, with their min-max as the spread; beyond noise when that spread lies wholly on
one side of 1.

Links: ``fast`` (NCCL's default transports: NVLink) and ``slow`` (NCCL over sockets: no P2P, no shared memory, no
InfiniBand), the bandwidth where weight and gradient quantization are meant to pay off.

    source benchmarks/gpu_env.sh && python3 benchmarks/e2e.py --link fast    # then --link slow
    python benchmarks/e2e.py --smoke --out /tmp/e2e                          # the whole pipeline on CPU, tiny GPT

Writes NAME.{json,md,png} into --out (NAME: e2e_LINK, or --name), after every repetition, so a run stopped by
``--deadline`` leaves what it measured; the figures, tables and plot are ``benchmarks/e2e_report.py``'s (``--render
NAME.json`` writes them again from the JSON). ``--profile CONFIG [CONFIG ...]`` adds one job that profiles the last 3
steps of each on rank 0 (NAME_profile.md: where the kernel time goes, and the top operations by device time;
NAME_profile_CONFIG.trace.json.gz: the Chrome traces).
"""
import argparse
import concurrent.futures
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from harness import launch  # noqa: E402
from benchmarks import common, e2e_report  # noqa: E402
from benchmarks.e2e_report import median_ms, write  # noqa: E402
from deepspeed_zeropp.simulate import runner  # noqa: E402


def run_options(config):
    """The harness's run options of one of the simulated world's configurations (``runner.CONFIGS``)."""
    switches = {"quantized": "zero_quantized_weights", "quantized_gradients": "zero_quantized_gradients"}
    return {option: True for option, switch in switches.items() if config.zero.get(switch)}


# key: (label, patched, run options), in the order of every repetition
CONFIGS = {
    key: (runner.CONFIGS[key].label, runner.CONFIGS[key].patched, run_options(runner.CONFIGS[key]))
    for key in e2e_report.KEYS
}
LINKS = {  # NCCL settings per link, on top of gpu_env.sh's (NVLink multicast off)
    "fast": {},
    "slow": {
        "NCCL_P2P_DISABLE": "1",
        "NCCL_SHM_DISABLE": "1",
        "NCCL_IB_DISABLE": "1"
    },
}
REQUIRED_ENV = ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS")
SMOKE = dict(layers=2, width=64, heads=2, seq=32, batch=2, steps=3, warmup=1, reps=3)
T0 = time.monotonic()


def log(message):
    print(f"[{time.strftime('%H:%M:%S')} +{time.monotonic() - T0:5.0f} s] {message}", flush=True)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--link", choices=LINKS, default="fast")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    parser.add_argument("--name", help="file stem of the results (default e2e_LINK, e2e_smoke with --smoke)")
    parser.add_argument("--configs", nargs="+", choices=CONFIGS, default=list(CONFIGS))
    parser.add_argument("--reps", type=int, default=3, help="repetitions (jobs) of all configurations")
    parser.add_argument("--rotate",
                        action="store_true",
                        help="start each repetition one configuration further along (A B C, B C A, ...)")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per run")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps per run, before the timed ones")
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--vocab", type=int, default=50304, help="even, or upstream's qgZ cannot run")
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=8, help="micro-batch per rank")
    parser.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), default="bf16")
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--reduce-bucket",
                        type=int,
                        default=2**22,
                        help="DeepSpeed's reduce_bucket_size, elements (its own default: 5e8; qgZ reduces a bucket "
                        "per call, so larger buckets let more gradients share its all-to-alls)")
    parser.add_argument("--deadline",
                        type=float,
                        default=540,
                        help="seconds from start: no job starts that the "
                        "last repetition's duration says would end later, and a running one is stopped there")
    parser.add_argument("--profile",
                        nargs="+",
                        choices=CONFIGS,
                        help="also profile 3 steps of these configurations on rank 0, in one job")
    parser.add_argument("--device", choices=("cuda-isolated", "cpu"), default="cuda-isolated")
    parser.add_argument("--smoke",
                        action="store_true",
                        help="CPU over gloo, tiny GPT: " + ", ".join(f"{k} {v}" for k, v in SMOKE.items()))
    parser.add_argument("--commit", help="the commit measured, where the tree is not a git checkout")
    parser.add_argument("--render", type=Path, help="only rewrite NAME.md and .png from this NAME.json")
    args = parser.parse_args(argv)
    if args.smoke:  # the tiny sizes become the defaults: what the command line names still counts
        parser.set_defaults(device="cpu", **SMOKE)
        args = parser.parse_args(argv)
        args.device = "cpu"
    args.name = args.name or ("e2e_smoke" if args.smoke else f"e2e_{args.link}")
    if args.reps < 0 or args.steps < 1 or args.warmup < 0:
        parser.error("--reps must be >= 0, --steps >= 1, --warmup >= 0")
    if args.device != "cpu" and not args.render and not all(os.environ.get(key) for key in REQUIRED_ENV):
        parser.error(f"set {', '.join(REQUIRED_ENV)} first (source benchmarks/gpu_env.sh)")
    return args


def spec_of(args, runs):
    return {
        "model": "gpt",
        "model_args": dict(layers=args.layers, width=args.width, heads=args.heads, seq=args.seq, vocab=args.vocab),
        "batch_size": args.batch,
        "dtype": args.dtype,
        "patch": True,
        "checks": False,
        "steps": args.warmup + args.steps,
        "seed": 0,
        "lr": args.lr,
        "runs": runs,
    }


def run_of(args, key, **extra):
    label, patched, options = CONFIGS[key]
    return dict(options, name=key, patch=patched, zero_init="config", reduce_bucket_size=args.reduce_bucket, **extra)


def order_of(args, rep):
    """The configurations of repetition ``rep``: as given (A B C, A B C, ...), or with ``--rotate`` each repetition
    one further along (A B C, B C A, ...), so that no configuration always runs first or after the same one."""
    shift = rep % len(args.configs) if args.rotate else 0
    return args.configs[shift:] + args.configs[:shift]


def job(args, runs, timeout):
    env = dict(LINKS[args.link]) if args.device != "cpu" else {}
    return launch.run_job(spec_of(args, runs),
                          world_size=2,
                          timeout=timeout,
                          env=env,
                          device=args.device,
                          local_size=1)  # on CPU: one rank per node, so qgZ runs


def prebuild():
    """Build (or load from the cache) our kernels and DeepSpeed's quantizer op once, side by side, before any job:
    else the first run of each builds them on both ranks inside a timed job."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    env.setdefault("TORCH_EXTENSIONS_DIR", launch.extensions_dir())  # where the jobs look
    codes = {
        "ours": "from deepspeed_zeropp.backends import cuda; e = cuda.load_error(); assert e is None, e",
        "DeepSpeed's": "from deepspeed.ops.op_builder import QuantizerBuilder; QuantizerBuilder().load()",
    }

    def build(code):
        start = time.monotonic()
        try:
            done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=240)
        except subprocess.TimeoutExpired:
            return time.monotonic() - start, "timeout", "no build within 240 s"
        return time.monotonic() - start, done.returncode, (done.stdout + done.stderr)[-600:]

    with concurrent.futures.ThreadPoolExecutor(len(codes)) as pool:
        for (name, _), (seconds, code, tail) in zip(codes.items(), pool.map(build, codes.values())):
            log(f"{name} quantizer op ready in {seconds:.1f} s" if code == 0 else f"{name} op build FAILED:\n{tail}")


def environment(args, commit):
    """common.environment's figures (no CUDA context in this process: the jobs' ranks hold the GPUs), the device
    and the link's NCCL settings."""
    env = common.environment(device=args.device, commit_id=commit)
    env["device"] = args.device
    env["link_env"] = {
        k: v
        for k, v in sorted(os.environ.items()) if k.startswith(("NCCL_", "TORCH_SYMM_MEM", "NVSHMEM_"))
    }
    env["link_env"].update(LINKS[args.link] if args.device != "cpu" else {})
    return env


def profile(args, left, commit):
    """One job: each configuration of --profile with the profiler over its last 3 steps on rank 0, into
    NAME_profile.md (and NAME_profile_CONFIG.trace.json.gz, the Chrome traces)."""
    tables = {key: args.out / f"{args.name}_profile_{key}.txt" for key in args.profile}
    steps = args.steps
    args.steps = 3
    try:
        runs = [run_of(args, key, profile={"path": str(tables[key]), "steps": 3}) for key in args.profile]
        out = job(args, runs, timeout=left)
    finally:
        args.steps = steps
    profiles = {}
    for key, table in tables.items():
        run = out["runs"].get(key, {"error": "not run"})
        if "error" in run:
            raise RuntimeError(f"{key}: {run['error']}")
        trace = args.out / f"{args.name}_profile_{key}.trace.json.gz"
        Path(f"{table}.trace.json.gz").rename(trace)
        profiles[key] = (run["step_ms"], table.read_text(), e2e_report.kernel_breakdown(trace))
        table.unlink()
    (args.out / f"{args.name}_profile.md").write_text(e2e_report.profile_markdown(args, profiles, commit))
    log(f"wrote {args.out / (args.name + '_profile.md')} and the traces")


def main(argv=None):
    args = parse_args(argv)
    if args.render:
        return e2e_report.render(args)
    commit = common.commit(args.commit)
    env = environment(args, commit)
    log(f"{args.name}: {args.link} link, {', '.join(args.configs)}; {args.reps} x ({args.warmup} + {args.steps} "
        f"steps); model {args.layers} x {args.width}, seq {args.seq}, batch {args.batch}; commit {commit}; "
        f"deadline {args.deadline:.0f} s")
    if args.device != "cpu":
        prebuild()
    reps, last = [], None
    for rep in range(args.reps):
        left = args.deadline - (time.monotonic() - T0)
        if last is not None and last * 1.05 > left:
            log(f"stopping before repetition {rep + 1}: {left:.0f} s left, the last one took {last:.0f} s")
            break
        log(f"repetition {rep + 1}/{args.reps} ({left:.0f} s left)")
        start = time.monotonic()
        # A hung run (a rank stuck in a collective) must not use up the time left: twice the last repetition.
        timeout = left if last is None else min(left, 2 * last + 60)
        try:
            out = job(args, [run_of(args, key) for key in order_of(args, rep)], timeout=max(30, int(timeout)))
            reps.append(out)
        except launch.JobFailed as error:  # keep the runs it finished
            reps.append(dict(error.partial or {"runs": {}}, job_error=str(error)[-4000:]))
            log(f"repetition {rep + 1} failed: {str(error)[-3000:]}")
        last = time.monotonic() - start
        for key, run in reps[-1]["runs"].items():
            if "error" in run:
                log(f"  {key}: ERROR {run['error'][:300]}")
            else:
                log(f"  {key}: median {median_ms(run, args.warmup):.1f} ms over {args.steps} steps, final loss "
                    f"{run['losses'][-1]:.4f}")
        result, _ = write(args, reps, env, commit)
        log(f"repetition {rep + 1} took {last:.0f} s; wrote {args.out / args.name}.{{json,md,png}}")
    if args.profile:
        left = args.deadline - (time.monotonic() - T0)
        if left < 30:
            log(f"no time left to profile ({left:.0f} s)")
        else:
            log(f"profiling {', '.join(args.profile)} ({left:.0f} s left)")
            try:
                profile(args, int(left), commit)
            except (launch.JobFailed, RuntimeError, OSError) as error:
                log(f"profile failed: {str(error)[:2000]}")
    if reps:
        result, plotted = write(args, reps, env, commit)
        print(e2e_report.markdown(args, result).split("## Loss per step")[0], flush=True)
    log("done")


if __name__ == "__main__":
    main()
