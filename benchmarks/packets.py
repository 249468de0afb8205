"""A quantized fetch's own work on the CUDA backend, with and without its packet entry points: quantize writing into
the packet (``quantize_into``) and the gathered packets dequantized in place (``dequantize_ranks``), against the
backend's plain quantize / dequantize with copies into and out of the packets (what ``ops`` does for a backend
without them); and a bucket's wait (``ops.dequantize_packed_parts``: every parameter's part of the 8 packets in a
buffer of its own) written in place, one kernel for the bucket (``dequantize_parts_into``, the backend's
``WRITES_PARTS`` on), against one dequantize of the bucket and a copy per parameter. Timed interleaved in one
process (the order rotated every trial), wall time per call between CUDA events, so host work counts wherever it
outlasts the kernels; kernel launches counted with the profiler.

Per-rank sizes: a 1-D tensor, a 2048 x 2048 matrix's share of 8 ranks, and the share of 7 such matrices (a fetch of
several of the 1.4B GPT's linear layers at once, its wait 7 parameters); 8 packets gathered, bf16.

    python benchmarks/packets.py [--out benchmarks/results]      (a CUDA GPU)
writes packets.{json,md}.
"""
import argparse
import contextlib
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from deepspeed_zeropp import ops  # noqa: E402
from deepspeed_zeropp.backends import cuda  # noqa: E402
from benchmarks.common import commit, interleaved, paired_ratio  # noqa: E402

RANKS = 8
SIZES = {"1-D tensor": 2048, "matrix share": 2048 * 2048 // RANKS, "bucket share": 7 * 2048 * 2048 // RANKS}
ENTRY_POINTS = ("quantize_into", "dequantize_ranks")
TRIALS, REPS = 9, 50

STEPS = ("quantize", "dequantize", "bucket wait")


@contextlib.contextmanager
def writing_parts(on):
    saved = cuda.WRITES_PARTS
    cuda.WRITES_PARTS = on
    try:
        yield
    finally:
        cuda.WRITES_PARTS = saved


@contextlib.contextmanager
def without_entry_points():
    saved = {name: getattr(cuda, name) for name in ENTRY_POINTS}
    for name in ENTRY_POINTS:
        delattr(cuda, name)
    try:
        yield
    finally:
        for name, function in saved.items():
            setattr(cuda, name, function)


def launches(fn, inputs):
    fn(inputs[0])
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
        fn(inputs[0])
        torch.cuda.synchronize()
    return sum(1 for event in profile.events() if event.device_type == torch.autograd.DeviceType.CUDA)


def measure():
    rows = []
    for name, numel in SIZES.items():
        part = torch.randn(numel, device="cuda").to(torch.bfloat16)
        codes, _ = ops.quantize_packed(part, backend="cuda")
        info = ops.packet_of(codes)
        received, layout = info.buffer.repeat(RANKS), info.layout
        count = RANKS * numel

        def quantize(x):
            return ops.quantize_packed(x, backend="cuda")

        def dequantize(buffer):
            return ops.dequantize_packed(buffer, layout, (count, ), torch.bfloat16, backend="cuda")

        matrices = max(1, numel // (2048 * 2048 // RANKS))
        parts = [numel // matrices] * matrices
        dtypes = [torch.bfloat16] * matrices

        def wait(on):

            def run(buffer):
                with writing_parts(on):
                    return ops.dequantize_packed_parts(buffer, layout, parts, dtypes, backend="cuda")

            return run

        def plain(fn):

            def run(x):
                with without_entry_points():
                    return fn(x)

            return run

        functions = {
            "quantize, in place": (quantize, [part]),
            "quantize, copies": (plain(quantize), [part]),
            "dequantize, in place": (dequantize, [received]),
            "dequantize, copies": (plain(dequantize), [received]),
            "bucket wait, in place": (wait(True), [received]),
            "bucket wait, copies": (wait(False), [received]),
        }
        for fn, inputs in functions.values():
            for _ in range(3):
                fn(inputs[0])
        torch.cuda.synchronize()
        samples = interleaved(functions, REPS, TRIALS)
        row = {"size": name, "numel": numel, "us": {}, "launches": {}, "speedup": {}}
        for key, (fn, inputs) in functions.items():
            row["us"][key] = [s * 1e6 for s in samples[key]]
            row["launches"][key] = launches(fn, inputs)
        for step in STEPS:
            row["speedup"][step] = paired_ratio(samples[f"{step}, in place"], samples[f"{step}, copies"])
        rows.append(row)
    return {
        "commit": commit(),
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "ranks": RANKS,
        "trials": TRIALS,
        "reps": REPS,
        "rows": rows
    }


def render(results):
    lines = [
        f"# A quantized fetch's packet work, in place vs copies ({results['gpu']})", "",
        f"Commit {results['commit']}; torch {results['torch']}; bf16, {results['ranks']} packets gathered. "
        f"{results['trials']} interleaved trials of {results['reps']} calls (order rotated every trial); µs per call "
        "(wall time between CUDA events: host work counts where it outlasts the kernels), median (min-max over "
        "trials); speed-up: copies / in place within each trial; kernel launches per call.", "",
        "| per-rank size | step | in place, µs | copies, µs | speed-up | launches (in place / copies) |",
        "|---|---|---|---|---|---|"
    ]
    for row in results["rows"]:
        for step in STEPS:
            cells = []
            for way in ("in place", "copies"):
                us = row["us"][f"{step}, {way}"]
                cells.append(f"{statistics.median(us):.1f} ({min(us):.1f}-{max(us):.1f})")
            s = row["speedup"][step]
            lines.append(f"| {row['size']} ({row['numel']:,}) | {step} | {cells[0]} | {cells[1]} | "
                         f"{s['ratio']:.2f}x ({s['low']:.2f}-{s['high']:.2f}) | "
                         f"{row['launches'][step + ', in place']} / {row['launches'][step + ', copies']} |")
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    args = parser.parse_args()
    results = measure()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "packets.json").write_text(json.dumps(results, indent=1) + "\n")
    (args.out / "packets.md").write_text(render(results))
    print(render(results))


if __name__ == "__main__":
    main()
