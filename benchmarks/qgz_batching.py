"""qgZ's reduce-scatter of one gradient bucket, each 4-bit gradient in its own all-to-all (``BATCH_BYTES = 0``: as
upstream, and as this package did before batching) against the bucket's gradients sharing them (the default
``qgz.BATCH_BYTES``), timed interleaved in one process (benchmarks/common.py's interleaved: the order rotated every trial).

One rank on one GPU (NCCL, world size 1): the all-to-all is a local copy, so this measures what sharing saves in host
work and launches, not the link's round trips, which it also saves on a real job. Buckets: layers of the 1.3B GPT of
benchmarks/e2e.py (width 2048; per layer 4 weight matrices and 8 1-D tensors), bf16.

    python benchmarks/qgz_batching.py [--out benchmarks/results]      (a CUDA GPU, DeepSpeed importable)
writes qgz_batching.{json,md}.
"""
import argparse
import json
import os
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import commit, interleaved, paired_ratio  # noqa: E402

WIDTH = 2048
MATRICES = [(WIDTH, 3 * WIDTH), (WIDTH, WIDTH), (WIDTH, 4 * WIDTH), (4 * WIDTH, WIDTH)]
VECTORS = [(3 * WIDTH, ), (WIDTH, ), (4 * WIDTH, ),
           (WIDTH, )] + [(WIDTH, )] * 4  # biases, then 2 norms' weight and bias
LAYER = MATRICES + VECTORS
BUCKETS = {"1 layer": 1, "4 layers": 4, "24 layers": 24}
TRIALS, REPS = 9, 10


def measure():
    import deepspeed
    import deepspeed_zeropp
    from deepspeed_zeropp import qgz
    for key, value in (("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29561"), ("RANK", "0"), ("WORLD_SIZE", "1"),
                       ("LOCAL_RANK", "0")):
        os.environ.setdefault(key, value)
    deepspeed_zeropp.patch()
    deepspeed.init_distributed(dist_backend="nccl")
    topology = (1, 1, 1, 0, 1.0)  # world, ranks per node, nodes, rank, the mean's factor
    groups = {"global_0": None}  # the default group
    default = qgz.BATCH_BYTES

    def reduce(limit):

        def run(bucket):
            qgz.BATCH_BYTES = limit
            try:
                return qgz.reduce_scatter(bucket, groups, topology)
            finally:
                qgz.BATCH_BYTES = default

        return run

    rows = []
    for name, layers in BUCKETS.items():
        bucket = [torch.randn(shape, device="cuda").to(torch.bfloat16) for _ in range(layers) for shape in LAYER]
        functions = {"per_gradient": (reduce(0), [bucket]), "shared": (reduce(default), [bucket])}
        for fn, inputs in functions.values():
            for _ in range(3):
                fn(inputs[0])
        torch.cuda.synchronize()
        samples = interleaved(functions, REPS, TRIALS)
        rows.append({
            "bucket": name,
            "tensors": len(bucket),
            "four_bit": sum(qgz.quantizes(t, 1) for t in bucket),
            "ms": {
                k: [s * 1e3 for s in v]
                for k, v in samples.items()
            },
            "speedup": paired_ratio(samples["shared"], samples["per_gradient"]),
        })
        del bucket
        torch.cuda.empty_cache()
    return {
        "commit": commit(),
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "deepspeed": deepspeed.__version__,
        "batch_bytes": default,
        "trials": TRIALS,
        "reps": REPS,
        "rows": rows
    }


def render(results):
    lines = [
        f"# qgZ: a bucket's 4-bit gradients in shared all-to-alls vs one each ({results['gpu']}, one rank)", "",
        f"Commit {results['commit']}; DeepSpeed {results['deepspeed']}, torch {results['torch']}. "
        f"`BATCH_BYTES` = {results['batch_bytes']}. {results['trials']} interleaved trials of {results['reps']} "
        "reduce-scatters each (order rotated every trial); ms per bucket: median (min-max over trials); speed-up: "
        "per-gradient time / shared time within each trial, median (min-max).", "",
        "One rank (NCCL, world size 1): the all-to-all is a local copy, so the figures are host work and launches "
        "saved, not link round trips.", "", "| bucket (bf16) | tensors (4-bit) | one all-to-all per gradient, ms | "
        "shared all-to-alls, ms | speed-up |", "|---|---|---|---|---|"
    ]
    for row in results["rows"]:
        cells = []
        for key in ("per_gradient", "shared"):
            ms = row["ms"][key]
            cells.append(f"{statistics.median(ms):.2f} ({min(ms):.2f}-{max(ms):.2f})")
        s = row["speedup"]
        lines.append(f"| {row['bucket']} | {row['tensors']} ({row['four_bit']}) | {cells[0]} | {cells[1]} | "
                     f"{s['ratio']:.2f}x ({s['low']:.2f}-{s['high']:.2f}) |")
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    results = measure()
    (args.out / "qgz_batching.json").write_text(json.dumps(results, indent=1))
    (args.out / "qgz_batching.md").write_text(render(results))
    print(render(results))


if __name__ == "__main__":
    main()
