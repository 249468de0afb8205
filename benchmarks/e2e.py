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
``--deadline`` leaves what it measured. ``--profile CONFIG [CONFIG ...]`` adds one job that profiles the last 3
steps of each on rank 0 (NAME_profile.md: where the kernel time goes, and the top operations by device time;
NAME_profile_CONFIG.trace.json.gz: the Chrome traces).
"""
import argparse
import concurrent.futures
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from harness import launch  # noqa: E402

CONFIGS = {  # key: (label, patched, run options); the order is the order within every repetition
    "unquantized": ("unquantized", False, {}),
    "ours-qwz": ("ours qwZ", True, {
        "quantized": True
    }),
    "ours-qwz-qgz": ("ours qwZ+qgZ", True, {
        "quantized": True,
        "quantized_gradients": True
    }),
    "upstream-qwz": ("upstream qwZ", False, {
        "quantized": True
    }),
    "upstream-qwz-qgz": ("upstream qwZ+qgZ", False, {
        "quantized": True,
        "quantized_gradients": True
    }),
}
UPSTREAM_OF = {"ours-qwz": "upstream-qwz", "ours-qwz-qgz": "upstream-qwz-qgz"}
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


def median_ms(run, warmup):
    return statistics.median(run["step_ms"][warmup:])


def summarize(args, reps):
    """Per configuration: each repetition's median step time, their median and spread, errors, quantized calls."""
    summary = {}
    for key in args.configs:
        runs = [rep["runs"].get(key) for rep in reps]
        ok = [run for run in runs if run and "step_ms" in run]
        by_rep = [median_ms(run, args.warmup) if run in ok else None for run in runs]
        medians = [m for m in by_rep if m is not None]
        counts = ok[0]["counts"] if ok else {}
        entry = dict(label=CONFIGS[key][0],
                     rep_medians_ms=medians,
                     by_rep_ms=by_rep,
                     median_ms=None,
                     min_ms=None,
                     max_ms=None)
        if medians:
            entry.update(median_ms=statistics.median(medians), min_ms=min(medians), max_ms=max(medians))
        entry["errors"] = [run.get("error", "no result") if run else "not run" for run in runs if run not in ok]
        entry["weight_gathers_quantized"] = sum(
            counts.get(k, 0) for k in ("quantized_bucket_gathers", "quantized_single_gathers"))
        entry["gradient_reductions_quantized"] = counts.get("quantized_gradient_reductions", 0)
        for memory in ("peak_memory_gb", "memory_at_start_gb"):  # on CUDA only
            entry[memory] = max((run[memory] for run in ok if memory in run), default=None)
        entry["losses_first_rep"] = ok[0]["losses"] if ok else []
        options = CONFIGS[key][2]
        wanted = {
            "weights": ("quantized", "weight_gathers_quantized"),
            "gradients": ("quantized_gradients", "gradient_reductions_quantized")
        }
        entry["not_quantized"] = [
            what for what, (option, count) in wanted.items() if ok and options.get(option) and not entry[count]
        ]
        summary[key] = entry
    return summary


def compare(summary, key, reference):
    """Speed-up of ``key`` over ``reference`` (reference time / key time), repetition by repetition: the two ran in
    the same job, side by side, so each repetition gives one ratio. The median of those ratios, their min-max as
    the spread; beyond noise when the whole spread lies on one side of 1."""
    a, b = summary.get(key), summary.get(reference)
    if not a or not b:
        return None
    paired = [y / x for x, y in zip(a["by_rep_ms"], b["by_rep_ms"]) if x is not None and y is not None]
    if not paired:
        return None
    low, high = min(paired), max(paired)
    return {
        "ratio": statistics.median(paired),
        "low": low,
        "high": high,
        "repetitions": len(paired),
        "beyond_noise": low > 1 or high < 1
    }


def ratios(summary):
    out = {}
    for key in summary:
        if key != "unquantized":
            out[f"{key} vs unquantized"] = compare(summary, key, "unquantized")
        if key in UPSTREAM_OF:
            out[f"{key} vs {UPSTREAM_OF[key]}"] = compare(summary, key, UPSTREAM_OF[key])
    return out


def checks(link, summary, ratio):
    """The targets, judged from the figures: (statement, met or None when a figure is missing, the figures)."""
    results = []

    def fmt(r):
        return f"{r['ratio']:.2f}x (spread {r['low']:.2f}-{r['high']:.2f}x)"

    if link == "slow":
        r = ratio.get("ours-qwz-qgz vs unquantized")
        results.append(("ours qwZ+qgZ >= 1.6x unquantized, beyond the spread", r
                        and r["low"] >= 1.6, fmt(r) if r else "missing"))
        r = ratio.get("ours-qwz-qgz vs upstream-qwz-qgz")
        results.append(("ours qwZ+qgZ faster than upstream qwZ+qgZ, beyond the spread", r
                        and r["low"] > 1, fmt(r) if r else "missing"))
    else:
        for key, upstream in UPSTREAM_OF.items():
            r = ratio.get(f"{key} vs {upstream}")
            results.append((f"{CONFIGS[key][0]} at least as fast as {CONFIGS[upstream][0]} (medians)", r
                            and r["ratio"] >= 1, fmt(r) if r else "missing"))
        ours, upstream = ratio.get("ours-qwz vs unquantized"), ratio.get("upstream-qwz vs unquantized")
        if ours and upstream:
            over = (1 / ours["ratio"] - 1, 1 / upstream["ratio"] - 1)
            results.append(("ours qwZ overhead over unquantized <= upstream's (medians)", over[0]
                            <= over[1], f"ours {100 * over[0]:+.1f}%, upstream {100 * over[1]:+.1f}%"))
        else:
            results.append(("ours qwZ overhead over unquantized <= upstream's (medians)", None, "missing"))
    return [{"target": t, "met": None if met is None else bool(met), "figures": f} for t, met, f in results]


def git_commit(args):
    """--commit, else what the kernel benchmark names ($BENCH_COMMIT or the checkout's commit, "+dirty" if edited)."""
    from benchmarks.bench_kernels import commit
    return args.commit or commit()


def environment(args):
    import torch
    env = {"python": platform.python_version(), "torch": torch.__version__, "device": args.device}
    if args.device != "cpu":
        query = ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"]
        try:
            env["gpus"] = subprocess.run(query, capture_output=True, text=True, check=True).stdout.strip().splitlines()
        except (OSError, subprocess.CalledProcessError):
            env["gpus"] = "unknown"
        env["cuda"] = torch.version.cuda
        env["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    env["link_env"] = {
        k: v
        for k, v in sorted(os.environ.items()) if k.startswith(("NCCL_", "TORCH_SYMM_MEM", "NVSHMEM_"))
    }
    env["link_env"].update(LINKS[args.link] if args.device != "cpu" else {})
    return env


def fmt_ms(value):
    return "—" if value is None else f"{value:.1f}"


def fmt_ratio(r):
    if r is None:
        return "—"
    return f"{r['ratio']:.2f}x ({r['low']:.2f}-{r['high']:.2f}){'' if r['beyond_noise'] else ', within noise'}"


def prose(args, summary, ratio):
    """Sentences built from the figures only."""
    lines = []
    base = summary.get("unquantized", {}).get("median_ms")
    for key in args.configs:
        s = summary[key]
        if s["median_ms"] is None:
            lines.append(f"- {s['label']}: no timed repetition ({'; '.join(e[:120] for e in s['errors'])}).")
            continue
        text = f"- {s['label']}: {s['median_ms']:.1f} ms per step (repetitions {fmt_ms(s['min_ms'])}-" \
            f"{fmt_ms(s['max_ms'])} ms)"
        r = ratio.get(f"{key} vs unquantized")
        if r and base:
            faster = "faster" if r["ratio"] >= 1 else "slower"
            text += f", {r['ratio']:.2f}x the unquantized speed ({faster}{'' if r['beyond_noise'] else ', within noise'})"
        if key in UPSTREAM_OF and ratio.get(f"{key} vs {UPSTREAM_OF[key]}"):
            r = ratio[f"{key} vs {UPSTREAM_OF[key]}"]
            text += f", {r['ratio']:.2f}x upstream's speed ({'beyond' if r['beyond_noise'] else 'within'} noise)"
        if s["not_quantized"]:
            text += f"; WARNING: no quantized {' or '.join(s['not_quantized'])} counted"
        lines.append(text + ".")
    return lines


def markdown(args, result):
    summary, ratio = result["summary"], result["ratios"]
    env, model = result["environment"], result["model"]
    lines = [
        f"# End-to-end ZeRO-3 step time, {args.link} link ({args.device})", "",
        f"Commit {result['commit']}; DeepSpeed {result.get('deepspeed', '?')}, torch {env['torch']}"
        f"{', CUDA ' + str(env.get('cuda')) if env.get('cuda') else ''}"
        f"{', NCCL ' + env['nccl'] if env.get('nccl') else ''}; GPUs: {env.get('gpus', 'none')}.",
        f"Link settings: {', '.join(f'{k}={v}' for k, v in env['link_env'].items()) or 'defaults'}.", "",
        f"Model: GPT-2 architecture, {model['layers']} layers, width {model['width']}, {model['heads']} heads, "
        f"vocab {args.vocab}, {size(model['parameters'])} parameters, {args.dtype}, built under zero.Init; "
        f"sequence {args.seq}, micro-batch {args.batch} per rank, 2 ranks as 2 nodes, AdamW lr {args.lr}, "
        f"reduce buckets of {args.reduce_bucket} elements. "
        f"{len(result['reps'])} repetitions (one job each, configurations interleaved in the order below"
        f"{', rotated by one each repetition' if args.rotate else ''}), "
        f"{args.steps} timed steps per run after {args.warmup} untimed.", "",
        "| configuration | median step, ms | spread, ms | repetition medians, ms | vs unquantized | vs upstream | "
        "quantized gathers / reductions | peak GB |", "|---|---|---|---|---|---|---|---|"
    ]
    for key in args.configs:
        s = summary[key]
        up = ratio.get(f"{key} vs {UPSTREAM_OF[key]}") if key in UPSTREAM_OF else None
        lines.append(f"| {s['label']} | {fmt_ms(s['median_ms'])} | {fmt_ms(s['min_ms'])}-{fmt_ms(s['max_ms'])} | "
                     f"{', '.join(f'{m:.1f}' for m in s['rep_medians_ms'])} | "
                     f"{fmt_ratio(ratio.get(f'{key} vs unquantized'))} | {fmt_ratio(up)} | "
                     f"{s['weight_gathers_quantized']} / {s['gradient_reductions_quantized']} | "
                     f"{fmt_ms(s['peak_memory_gb'])} |")
    lines += [
        "", "Ratios are speed-ups (reference time / this time), taken within each repetition (the two configurations "
        "in one job): their median, with their min-max over the repetitions in brackets; \"within noise\" where "
        "that range includes 1.", ""
    ]
    lines += prose(args, summary, ratio)
    lines += ["", "## Targets", ""]
    for c in result["checks"]:
        verdict = {True: "met", False: "MISSED", None: "not measured"}[c["met"]]
        lines.append(f"- {c['target']}: **{verdict}** ({c['figures']})")
    if (args.out / f"{args.name}_profile.md").exists():
        lines += ["", f"Where the time goes: {args.name}_profile.md (`--profile`)."]
    errors = [(summary[k]["label"], e) for k in args.configs for e in summary[k]["errors"]]
    errors += [(f"repetition {i + 1}", rep["job_error"]) for i, rep in enumerate(result["reps"]) if "job_error" in rep]
    if errors:
        lines += ["", "## Errors", ""] + [f"- {who}: `{error.splitlines()[0][:300]}`" for who, error in errors]
    traces = {summary[k]["label"]: summary[k]["losses_first_rep"] for k in args.configs}
    steps = max((len(t) for t in traces.values()), default=0)
    if steps:
        lines += [
            "", "## Loss per step (first repetition; steps before the first timed one marked *)", "",
            "| step | " + " | ".join(traces) + " |", "|---" * (len(traces) + 1) + "|"
        ]
        for step in range(steps):
            cells = [f"{t[step]:.4f}" if step < len(t) else "" for t in traces.values()]
            lines.append(f"| {step}{'*' if step < args.warmup else ''} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(args, result, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    summary = result["summary"]
    keys = [k for k in args.configs if summary[k]["median_ms"] is not None]
    fig, (bars, losses) = plt.subplots(1, 2, figsize=(13, 4.5))
    medians = [summary[k]["median_ms"] for k in keys]
    spread = [[m - summary[k]["min_ms"] for k, m in zip(keys, medians)],
              [summary[k]["max_ms"] - m for k, m in zip(keys, medians)]]
    bars.bar(range(len(keys)), medians, yerr=spread, capsize=5, color="tab:blue")
    for i, k in enumerate(keys):
        bars.plot([i] * len(summary[k]["rep_medians_ms"]), summary[k]["rep_medians_ms"], "k.", ms=4)
    bars.set_xticks(range(len(keys)), [summary[k]["label"] for k in keys], rotation=20, ha="right")
    bars.set_ylabel("median step time, ms (bars: repetitions' spread)")
    bars.set_title(f"{args.link} link, {size(result['model']['parameters'])} params, {args.dtype}")
    for k in args.configs:
        if summary[k]["losses_first_rep"]:
            losses.plot(summary[k]["losses_first_rep"], label=summary[k]["label"])
    losses.axvspan(-0.5, args.warmup - 0.5, color="0.9", label="untimed")
    losses.set_xlabel("step")
    losses.set_ylabel("loss (first repetition)")
    losses.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def size(count):
    return f"{count / 1e9:.2f}B" if count >= 1e9 else f"{count / 1e6:.1f}M"


def parameters(args):
    """GPT-2's parameter count (tied head): embeddings + 12 w^2 + 13 w per layer + the final LayerNorm."""
    w = args.width
    return args.vocab * w + args.seq * w + args.layers * (12 * w * w + 13 * w) + 2 * w


def write(args, reps, env, commit):
    summary = summarize(args, reps)
    ratio = ratios(summary)
    deepspeed = next((rep["deepspeed"] for rep in reps if "deepspeed" in rep), None)
    result = {
        "name":
        args.name,
        "commit":
        commit,
        "deepspeed":
        deepspeed,
        "environment":
        env,
        "link":
        args.link,
        "model":
        dict(layers=args.layers, width=args.width, heads=args.heads, vocab=args.vocab, parameters=parameters(args)),
        "settings": {
            k: str(v) if isinstance(v, Path) else v
            for k, v in vars(args).items()
        },
        "summary":
        summary,
        "ratios":
        ratio,
        "checks":
        checks(args.link, summary, ratio),
        "reps":
        reps,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(result, indent=1))
    (args.out / f"{args.name}.md").write_text(markdown(args, result))
    plotted = plot(args, result, args.out / f"{args.name}.png")
    return result, plotted


def _union_ms(intervals):
    """Milliseconds covered by at least one of the (start, end) microsecond intervals."""
    total, current = 0.0, None
    for start, end in sorted(intervals):
        if current is None or start > current[1]:
            total += current[1] - current[0] if current else 0.0
            current = [start, end]
        else:
            current[1] = max(current[1], end)
    return (total + (current[1] - current[0] if current else 0.0)) / 1e3


def kernel_breakdown(trace_path):
    """Where the device time of a profiled stretch goes, from its Chrome trace (gzipped): the span from the first
    kernel's start to the last one's end, the time some kernel runs, NCCL kernels and the others (each as the
    union of their intervals, so overlapping streams count once), and per NCCL kernel its calls and summed time."""
    import gzip
    with gzip.open(trace_path, "rt") as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "kernel"]
    if not events:
        return None
    spans = [(e["ts"], e["ts"] + e["dur"], e["name"].startswith("nccl")) for e in events]
    nccl = {}
    for e in events:
        if e["name"].startswith("nccl"):
            calls, ms = nccl.get(e["name"].split("(")[0], (0, 0.0))
            nccl[e["name"].split("(")[0]] = (calls + 1, ms + e["dur"] / 1e3)
    return {
        "span_ms": (max(end for _, end, _ in spans) - min(start for start, _, _ in spans)) / 1e3,
        "busy_ms": _union_ms([(s, e) for s, e, _ in spans]),
        "nccl_ms": _union_ms([(s, e) for s, e, is_nccl in spans if is_nccl]),
        "compute_ms": _union_ms([(s, e) for s, e, is_nccl in spans if not is_nccl]),
        "nccl_kernels": {
            name: {
                "calls": c,
                "ms": ms
            }
            for name, (c, ms) in sorted(nccl.items())
        },
    }


def profile_markdown(args, profiles, commit):
    """NAME_profile.md: per profiled configuration, the job's step times, the kernel-time breakdown of the profiled
    steps and torch.profiler's table of the top operations by device time."""
    lines = [
        f"# Profiles, {args.link} link: the last 3 of {args.warmup} + 3 steps on rank 0", "",
        f"Commit {commit}; model and batch as in {args.name}.md. One job trains the configurations one after the other, each profiled over its last 3 steps "
        "(torch.profiler, which slows the host: compare configurations within this file, not with the step times "
        f"of {args.name}.md). Kernel time from the Chrome trace: *busy* is the time some kernel runs, *NCCL* and "
        "*compute* the time some NCCL or other kernel runs (streams overlap, so each is a union), *idle* the "
        "span minus busy.", "",
        "| configuration | step times, ms | span, ms | busy | NCCL | compute | idle | NCCL kernels: calls, ms |",
        "|---|---|---|---|---|---|---|---|"
    ]
    for key, (step_ms, _, kernels) in profiles.items():
        steps = ", ".join(f"{ms:.0f}" for ms in step_ms)
        if kernels is None:
            lines.append(f"| {CONFIGS[key][0]} | {steps} | no kernels traced |||||||")
            continue
        calls = "; ".join(f"{name.replace('ncclDevKernel_', '')} {k['calls']}, {k['ms']:.0f}"
                          for name, k in kernels["nccl_kernels"].items())
        lines.append(f"| {CONFIGS[key][0]} | {steps} | {kernels['span_ms']:.0f} | {kernels['busy_ms']:.0f} | "
                     f"{kernels['nccl_ms']:.0f} | {kernels['compute_ms']:.0f} | "
                     f"{kernels['span_ms'] - kernels['busy_ms']:.0f} | {calls} |")
    for key, (_, table, _) in profiles.items():
        lines += ["", f"## {CONFIGS[key][0]}: top operations by device time", "", "```", table.rstrip(), "```"]
    return "\n".join(lines) + "\n"


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
        profiles[key] = (run["step_ms"], table.read_text(), kernel_breakdown(trace))
        table.unlink()
    (args.out / f"{args.name}_profile.md").write_text(profile_markdown(args, profiles, commit))
    log(f"wrote {args.out / (args.name + '_profile.md')} and the traces")


def render(args):
    """NAME.md and .png again from NAME.json, e.g. on a machine with matplotlib. The JSON is written back with its
    measurements ("reps", the environment, the commit) unchanged and what is derived from them recomputed."""
    saved = json.loads(args.render.read_text())
    for key, value in saved["settings"].items():
        if key not in ("out", "name", "render"):
            setattr(args, key, value)
    args.out, args.name = args.render.parent, args.render.stem
    _, plotted = write(args, saved["reps"], saved["environment"], saved["commit"])
    log(f"wrote {args.out / args.name}.md{' and .png' if plotted else ' (no matplotlib: no .png)'}")


def main(argv=None):
    args = parse_args(argv)
    if args.render:
        return render(args)
    commit = git_commit(args)
    env = environment(args)
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
        print(markdown(args, result).split("## Loss per step")[0], flush=True)
    log("done")


if __name__ == "__main__":
    main()
