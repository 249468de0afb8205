"""The end-to-end benchmark's figures, tables and plot, from what ``benchmarks/e2e.py`` measured: NAME.json (the
measurements and the figures derived from them), NAME.md, NAME.png, and NAME_profile.md from a ``--profile`` job's
traces. A ratio between two configurations is taken within each repetition (one job, side by side): the median of
those ratios, with their min-max as the spread; beyond noise when that spread lies wholly on one side of 1.

    python benchmarks/e2e.py --render benchmarks/results/e2e_slow.json   # NAME.md and .png again from NAME.json

The configurations (labels, which ZeRO++ switches each sets) are the simulated world's,
``deepspeed_zeropp.simulate.runner.CONFIGS``.
"""
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import paired_ratio  # noqa: E402
from deepspeed_zeropp.simulate.runner import CONFIGS, UPSTREAM_OF as ALL_UPSTREAM_OF  # noqa: E402

# what each configuration's counts must show, by the ZeRO++ switch it sets
QUANTIZED_COUNTS = {
    "weights": ("zero_quantized_weights", "weight_gathers_quantized"),
    "gradients": ("zero_quantized_gradients", "gradient_reductions_quantized"),
}

# the configurations e2e.py runs (--configs), in their order within a repetition: the simulated world's, less those
# the 2-GPU job cannot run (hpZ needs more ranks; patch sites left out are the simulator's knob)
KEYS = ("unquantized", "ours-qwz", "ours-qwz-qgz", "upstream-qwz", "upstream-qwz-qgz")
UPSTREAM_OF = {ours: up for ours, up in ALL_UPSTREAM_OF.items() if ours in KEYS and up in KEYS}


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
        entry = dict(label=CONFIGS[key].label,
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
        zero = CONFIGS[key].zero
        entry["not_quantized"] = [
            what for what, (switch, count) in QUANTIZED_COUNTS.items() if ok and zero.get(switch) and not entry[count]
        ]
        summary[key] = entry
    return summary


def compare(summary, key, reference):
    """Speed-up of ``key`` over ``reference`` (reference time / key time), repetition by repetition: the two ran in
    the same job, side by side, so each repetition gives one ratio (``common.paired_ratio``)."""
    a, b = summary.get(key), summary.get(reference)
    if not a or not b:
        return None
    return paired_ratio(a["by_rep_ms"], b["by_rep_ms"])


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
            results.append((f"{CONFIGS[key].label} at least as fast as {CONFIGS[upstream].label} (medians)", r
                            and r["ratio"] >= 1, fmt(r) if r else "missing"))
        ours, upstream = ratio.get("ours-qwz vs unquantized"), ratio.get("upstream-qwz vs unquantized")
        if ours and upstream:
            over = (1 / ours["ratio"] - 1, 1 / upstream["ratio"] - 1)
            results.append(("ours qwZ overhead over unquantized <= upstream's (medians)", over[0]
                            <= over[1], f"ours {100 * over[0]:+.1f}%, upstream {100 * over[1]:+.1f}%"))
        else:
            results.append(("ours qwZ overhead over unquantized <= upstream's (medians)", None, "missing"))
    return [{"target": t, "met": None if met is None else bool(met), "figures": f} for t, met, f in results]


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
            lines.append(f"| {CONFIGS[key].label} | {steps} | no kernels traced |||||||")
            continue
        calls = "; ".join(f"{name.replace('ncclDevKernel_', '')} {k['calls']}, {k['ms']:.0f}"
                          for name, k in kernels["nccl_kernels"].items())
        lines.append(f"| {CONFIGS[key].label} | {steps} | {kernels['span_ms']:.0f} | {kernels['busy_ms']:.0f} | "
                     f"{kernels['nccl_ms']:.0f} | {kernels['compute_ms']:.0f} | "
                     f"{kernels['span_ms'] - kernels['busy_ms']:.0f} | {calls} |")
    for key, (_, table, _) in profiles.items():
        lines += ["", f"## {CONFIGS[key].label}: top operations by device time", "", "```", table.rstrip(), "```"]
    return "\n".join(lines) + "\n"


def render(args):
    """NAME.md and .png again from NAME.json (``args.render``), e.g. on a machine with matplotlib. ``args``: e2e.py's
    parsed command line, whose defaults stand for settings an older JSON lacks. The JSON is written back with its
    measurements ("reps", the environment, the commit) unchanged and what is derived from them recomputed."""
    saved = json.loads(args.render.read_text())
    for key, value in saved["settings"].items():
        if key not in ("out", "name", "render"):
            setattr(args, key, value)
    args.out, args.name = args.render.parent, args.render.stem
    _, plotted = write(args, saved["reps"], saved["environment"], saved["commit"])
    print(f"wrote {args.out / args.name}.md{' and .png' if plotted else ' (no matplotlib: no .png)'}", flush=True)
