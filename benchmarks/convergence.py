"""Convergence of ZeRO++ on real text: unquantized vs our qwZ+qgZ vs upstream's qwZ+qgZ, bf16 and fp16.

A GPT-2-small-shaped model (12 layers, width 768) over byte tokens of the Python standard library's own sources
(``harness.models.corpus``: offline on any machine), 2 GPUs with each rank seeing only its own GPU,
so DeepSpeed treats the ranks as two nodes and qgZ's quantized reduce-scatter runs. Every run trains from the same
seed on the same batches. The upstream runs use the installed DeepSpeed unpatched (its compiled quantizer, built on
first use). Each configuration and dtype is one job; with ``--parallel`` all jobs run side by side (the GPUs have room;
step times then mean nothing, only losses are compared).

    python benchmarks/convergence.py [--steps 500] [--dtypes bf16 fp16] [--parallel] [--out DIR] [--commit SHA]
    python benchmarks/convergence.py --device cpu --dtypes bf16 --steps 3 --out /tmp/conv   # smoke test

``--loco`` adds qwZ+qgZ with LoCo (``zeropp_loco_param``), ours and upstream's: it needs a DeepSpeed with LoCo,
0.16.2 to 0.19.7 (0.19.8 rejects the key). ``--only`` picks configurations by name, ``--name`` the files' stem.

Writes NAME.{json,md,png} into --out (default benchmarks/results, NAME convergence).
"""
import argparse
import json
import statistics
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness.launch import run_job  # noqa: E402
from benchmarks import common  # noqa: E402

TAIL = 100  # the figure of merit: mean loss over the last TAIL steps
WARMUP = 50  # steps of linear learning-rate warm-up
CONFIGS = (  # (name, patched, run options)
    ("unquantized", True, {}),
    ("ours qwZ+qgZ", True, {
        "quantized": True,
        "quantized_gradients": True
    }),
    ("upstream qwZ+qgZ", False, {
        "quantized": True,
        "quantized_gradients": True
    }),
)
LOCO = {"err_beta": 0.8, "reset_T": 1024}
LOCO_CONFIGS = (
    ("ours qwZ+qgZ+LoCo", True, {
        "quantized": True,
        "quantized_gradients": True,
        "loco": LOCO
    }),
    ("upstream qwZ+qgZ+LoCo", False, {
        "quantized": True,
        "quantized_gradients": True,
        "loco": LOCO
    }),
)


def job(dtype, patched, runs, steps, lr, device):
    spec = {"model": "gpt2_bytes", "dtype": dtype, "patch": patched, "steps": steps, "seed": 0, "lr": lr}
    spec["runs"] = [dict(options, name=name, warmup=[lr, WARMUP]) for name, options in runs]
    return run_job(spec, world_size=2, device=device, timeout=3000, local_size=1)


def run_all(dtypes, steps, lr, parallel, device, configs=CONFIGS):
    """{dtype: {config name: run result}}: one job per dtype and configuration."""
    plan = [(dtype, patched, [(name, options)]) for dtype in dtypes for name, patched, options in configs]
    results = {dtype: {} for dtype in dtypes}
    meta = {}

    def one(dtype, patched, runs):
        try:
            out = job(dtype, patched, runs, steps, lr, device)
            results[dtype].update(out["runs"])
            meta.update(deepspeed=out["deepspeed"], torch=out["torch"])
        except Exception as error:  # a failed job is a result too (upstream may crash)
            for name, _ in runs:
                results[dtype][name] = {"error": f"{type(error).__name__}: {str(error)[-2000:]}"}

    threads = [threading.Thread(target=one, args=item) for item in plan]
    for thread in threads:
        thread.start()
        if not parallel:
            thread.join()
    for thread in threads:
        thread.join()
    return results, meta


def summary(results, configs=CONFIGS):
    rows = []
    for dtype, runs in results.items():
        base = runs.get("unquantized", {})
        base_tail = statistics.fmean(base["losses"][-TAIL:]) if "losses" in base else None
        for name, _, _ in configs:
            run = runs.get(name, {})
            if "losses" not in run:
                rows.append(dict(dtype=dtype, config=name, error=run.get("error", "not run")[:300]))
                continue
            losses = run["losses"]
            finite = [x for x in losses if x == x and abs(x) != float("inf")]
            tail = statistics.fmean(losses[-TAIL:])
            rows.append(
                dict(dtype=dtype,
                     config=name,
                     first=losses[0],
                     tail_mean=tail,
                     rel_to_unquantized=None if base_tail is None else tail / base_tail - 1,
                     max_abs_diff=None if "losses" not in base else max(
                         abs(a - b) for a, b in zip(losses, base["losses"])),
                     non_finite_steps=len(losses) - len(finite),
                     dtype_errors=len(run.get("dtype_errors", []))))
    return rows


def markdown(rows, meta, steps, lr, commit, corpus_bytes):
    lines = [
        f"# Convergence: GPT-2 small shape, byte-level Python stdlib text, {steps} steps",
        "",
        f"2 GPUs as 2 nodes (qgZ active), DeepSpeed {meta.get('deepspeed')}, torch {meta.get('torch')}, "
        f"commit {commit}. Corpus: {corpus_bytes} bytes. AdamW, lr {lr} after {WARMUP} steps of linear warm-up, micro-batch 4 x 256 tokens per rank, same "
        f"batches in every run. Figure of merit: mean loss over the last {TAIL} steps, relative to unquantized.",
        "",
        "| dtype | config | loss step 0 | mean loss, last 100 | vs unquantized | max abs diff per step | "
        "non-finite steps | dtype errors |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['dtype']} | {r['config']} | error: {r['error'][:120]} | | | | | |")
            continue
        rel = "—" if r["config"] == "unquantized" else f"{100 * r['rel_to_unquantized']:+.2f}%"
        lines.append(f"| {r['dtype']} | {r['config']} | {r['first']:.4f} | {r['tail_mean']:.4f} | {rel} | "
                     f"{r['max_abs_diff']:.4f} | {r['non_finite_steps']} | {r['dtype_errors']} |")
    return "\n".join(lines) + "\n"


def plot(results, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, axes = plt.subplots(1, len(results), figsize=(6 * len(results), 4), squeeze=False)
    for ax, (dtype, runs) in zip(axes[0], results.items()):
        for name, run in runs.items():
            if "losses" in run:
                window = 20
                smooth = [
                    statistics.fmean(run["losses"][max(0, i - window + 1):i + 1]) for i in range(len(run["losses"]))
                ]
                ax.plot(smooth, label=name)
        ax.set_title(f"{dtype} (loss, moving mean of 20 steps)")
        ax.set_xlabel("step")
        ax.set_ylabel("loss")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--dtypes", nargs="+", default=["bf16", "fp16"])
    parser.add_argument("--parallel", action="store_true")
    parser.add_argument("--device", default="cuda-isolated", help="cpu for a smoke test (2 ranks as 2 nodes, gloo)")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    parser.add_argument("--commit",
                        default=None,
                        help="the commit measured (default: $BENCH_COMMIT, else the checkout's, +dirty if edited)")
    parser.add_argument("--loco",
                        action="store_true",
                        help="add LoCo, ours and upstream's (DeepSpeed 0.16.2 to 0.19.7)")
    parser.add_argument("--only",
                        nargs="+",
                        default=None,
                        help="run only these configurations (names as in the table)")
    parser.add_argument("--name", default="convergence", help="stem of the result files")
    args = parser.parse_args()
    configs = CONFIGS + LOCO_CONFIGS if args.loco else CONFIGS
    configs = tuple(c for c in configs if args.only is None or c[0] in args.only)
    commit = common.commit(args.commit)
    from harness.models import corpus
    results, meta = run_all(args.dtypes, args.steps, args.lr, args.parallel, args.device, configs)
    rows = summary(results, configs)
    args.out.mkdir(parents=True, exist_ok=True)
    record = dict(meta, commit=commit, steps=args.steps, lr=args.lr, corpus_bytes=corpus()[0].numel(), summary=rows)
    record["runs"] = {
        d: {
            n: {
                k: r.get(k)
                for k in ("losses", "error", "dtype_errors", "step_ms")
            }
            for n, r in runs.items()
        }
        for d, runs in results.items()
    }
    (args.out / f"{args.name}.json").write_text(json.dumps(record, indent=1))
    text = markdown(rows, meta, args.steps, args.lr, commit, record["corpus_bytes"])
    (args.out / f"{args.name}.md").write_text(text)
    plot(results, args.out / f"{args.name}.png")
    print(text)


if __name__ == "__main__":
    main()
