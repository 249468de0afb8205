"""qgZ with 2 ranks as 2 nodes: accuracy against the exact mean and time per reduce-scatter, ours vs DeepSpeed's
kernels, per gradient dtype. Writes benchmarks/results/qgz_gpu.{json,md}, or qgz_gpu_shared.{json,md} with
``--device cuda-shared``.

    python benchmarks/qgz_gpu.py [--out DIR] [--device cuda-isolated|cuda-shared]   (DeepSpeed importable)

``cuda-isolated`` (default, 2 GPUs): each rank sees only its GPU, NCCL. ``cuda-shared`` (1 GPU): both ranks on GPU 0
over gloo, which stages every all-to-all through host memory: the errors are the same as over NCCL, the times are
gloo's and only compare ours with DeepSpeed's within that table.
"""
import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness.launch import run_job  # noqa: E402
from benchmarks.common import commit  # noqa: E402

CASES = [[dtype, [4096, 4096]] for dtype in ("fp16", "bf16", "fp32")] + [["bf16", [4096, 4096]]]

TRANSPORTS = {"cuda-isolated": ("2 GPUs", "NCCL", "qgz_gpu"), "cuda-shared": ("one GPU", "gloo", "qgz_gpu_shared")}


def measure(device):
    results = {"device": device}
    for label, patch in (("ours", True), ("deepspeed", False)):
        runs = [{
            "name": f"{dtype}",
            "qgz_check": True,
            "cases": [[dtype, shape]],
            "time_reps": 20
        } for dtype, shape in CASES[:3]]
        runs.append({"name": "bf16 x1e6", "qgz_check": True, "cases": [CASES[3]], "scale": 1e6, "time_reps": 5})
        job = run_job(
            {
                "model": "bert",
                "dtype": "bf16",
                "patch": patch,
                "runs": runs,
                "instruments": "harness.qgz_instruments"
            },
            device=device,
            timeout=400)
        results[label] = {"deepspeed": job["deepspeed"], "torch": job["torch"], "runs": job["runs"]}
    return results


def render(results):
    where, transport, _ = TRANSPORTS[results.get("device", "cuda-isolated")]
    lines = [
        f"# qgZ on {where}, 2 ranks as 2 nodes ({transport}), DeepSpeed {results['ours']['deepspeed']}, torch "
        f"{results['ours']['torch']}", "", f"Commit {results.get('commit', 'unknown')}.", "",
        "Gradient [4096, 4096] per rank; error of this rank's partition "
        "against the exact mean of both ranks' gradients (fp64). Time: median of 20 calls after 3 warm-ups, "
        "all-to-alls included.", "", "Ours: the qgZ CUDA kernels (csrc/qgz.cu). With one GPU per node there is "
        "no node-local sum, so ours rounds to 4 bits once; DeepSpeed quantizes and dequantizes through its "
        "node-local stage anyway (two roundings), hence its larger error on fp16. DeepSpeed reads bf16 and fp32 "
        "gradients as fp16 bits and returns fp16.", "", *([
            "Both ranks share one GPU and gloo stages every all-to-all through host memory: the errors are as over "
            "NCCL, the times are gloo's (compare ours with DeepSpeed's here only).", ""
        ] if transport == "gloo" else []),
        "| gradient | implementation | result dtype | finite | max error / max abs | RMS error / RMS | ms |",
        "|---|---|---|---|---|---|---|"
    ]
    for name in results["ours"]["runs"]:
        for label in ("ours", "deepspeed"):
            run = results[label]["runs"].get(name, {"error": "not reached"})
            if "error" in run:
                lines.append(f"| {name} | {label} | error: {run['error'][:80]} | | | | |")
                continue
            case = run["cases"][0]
            lines.append(
                f"| {name} | {label} | {case['dtype']} | {case['finite']} | {case['max_error_of_largest']:.3g}"
                f" | {case['rms_error_of_rms']:.3g} | {case['ms']:.2f} |")
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    parser.add_argument("--device", choices=sorted(TRANSPORTS), default="cuda-isolated")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    results = measure(args.device)
    results["commit"] = commit()
    stem = TRANSPORTS[args.device][2]
    (args.out / f"{stem}.json").write_text(json.dumps(results, indent=1))
    (args.out / f"{stem}.md").write_text(render(results))
    print(render(results))


if __name__ == "__main__":
    main()
