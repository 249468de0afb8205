"""Loss parity of a GPT-2-small-shaped model (from a config) on 2 GPUs over NCCL: zero_quantized_weights with the
patch vs no quantization, bf16 and fp32, 50 steps on learnable data (arithmetic token progressions). Writes
benchmarks/results/gpt2_parity.{json,md,png}.

    python benchmarks/gpt2_parity.py [--out DIR] [--steps 50]
"""
import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness.launch import run_job  # noqa: E402
from benchmarks.common import commit  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    parser.add_argument("--steps", type=int, default=50)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    results = {}
    for dtype in ("bf16", "fp32"):
        spec = {
            "model": "gpt2",
            "dtype": dtype,
            "patch": True,
            "steps": args.steps,
            "seed": 0,
            "lr": 3e-4,
            "runs": [{
                "name": "baseline"
            }, {
                "name": "qwz",
                "quantized": True
            }]
        }
        results[dtype] = run_job(spec, world_size=2, device="cuda", timeout=500)
    (args.out / "gpt2_parity.json").write_text(json.dumps(results, indent=1))
    lines = [
        f"# GPT-2 small (config), 2 GPUs NCCL, DeepSpeed {results['bf16']['deepspeed']}, torch "
        f"{results['bf16']['torch']}: qwZ (patched) vs no quantization", "", f"Commit {commit()}.", "",
        f"{args.steps} steps, AdamW lr 3e-4, micro-batch 4 x 256 tokens per rank, learnable data (arithmetic "
        "token progressions), same batches in both runs.", "",
        "| dtype | loss step 0 (base / qwZ) | final loss (base / qwZ) | max abs diff | mean abs diff | dtype errors |",
        "|---|---|---|---|---|---|"
    ]
    for dtype, result in results.items():
        base, qwz = result["runs"]["baseline"], result["runs"]["qwz"]
        if "error" in qwz or "error" in base:
            lines.append(f"| {dtype} | error: {qwz.get('error', base.get('error'))[:100]} | | | | |")
            continue
        diffs = [abs(a - b) for a, b in zip(base["losses"], qwz["losses"])]
        lines.append(f"| {dtype} | {base['losses'][0]:.4f} / {qwz['losses'][0]:.4f} | {base['losses'][-1]:.4f} / "
                     f"{qwz['losses'][-1]:.4f} | {max(diffs):.4f} | {sum(diffs) / len(diffs):.4f} | "
                     f"{len(qwz['dtype_errors'])} |")
    (args.out / "gpt2_parity.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, (dtype, result) in zip(axes, results.items()):
        for name, run in result["runs"].items():
            if "losses" in run:
                ax.plot(run["losses"], label=name)
        ax.set_title(f"GPT-2 small, {dtype}")
        ax.set_xlabel("step")
        ax.set_ylabel("loss")
        ax.legend()
    fig.tight_layout()
    fig.savefig(args.out / "gpt2_parity.png", dpi=110)


if __name__ == "__main__":
    main()
