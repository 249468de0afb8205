"""Kernel benchmark: effective GB/s of our CUDA quantizer vs DeepSpeed's op and the device copy, plus JIT build times.

Effective bytes are what a native kernel must move: input + codes + scales for quantize, codes + scales + output for
dequantize (the same count for DeepSpeed's fp16 detour, whose extra casts are its own cost); the copy moves the
input's bytes in and out (x.clone()). Every figure is the median over trials of the mean time of back-to-back calls,
timed with CUDA events after warm-up. Inputs rotate over enough buffers to exceed L2 several times, so small sizes
measure DRAM traffic plus launch latency, not cache hits.

    python -m deepspeed_zeropp bench --out benchmarks/results      (or: python benchmarks/bench_kernels.py)
writes kernels_h200.md (and kernels_h200.png when matplotlib is available) into --out.
"""
import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from .grouping import group_layout

PACKAGE_PARENT = Path(__file__).resolve().parents[1]  # so the timed subprocesses import this same copy

SIZES = {"1M": 2**20, "16M": 2**24, "134M": 2**27}
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
ROTATION_BYTES = 512 * 2**20  # several times the H200's 60 MB L2
TARGETS = "134M: >= 3800 GB/s; 16M: >= 3000 GB/s; 1M: <= 8 us per call (quantize and dequantize, every dtype)"
LOAD_SNIPPET = ("import time, torch; torch.cuda.init(); t = time.perf_counter(); "
                "from deepspeed_zeropp.backends import cuda; error = cuda.load_error(); "
                "print(time.perf_counter() - t if error is None else 'ERROR ' + error)")


def time_per_call(fn, inputs, reps, trials=7, warmup=20):
    """Median over trials of the mean seconds per call, cycling through ``inputs``."""
    for i in range(warmup):
        fn(inputs[i % len(inputs)])
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = []
    for _ in range(trials):
        start.record()
        for i in range(reps):
            fn(inputs[i % len(inputs)])
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / 1e3 / reps)
    return statistics.median(samples)


def timed_load(cache_dir):
    """Seconds a fresh process spends in load_error() (CUDA initialised beforehand) with the given build cache."""
    env = dict(os.environ, DEEPSPEED_ZEROPP_CACHE=str(cache_dir))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PACKAGE_PARENT), env.get("PYTHONPATH")]))
    result = subprocess.run([sys.executable, "-c", LOAD_SNIPPET], env=env, capture_output=True, text=True, check=True)
    line = result.stdout.strip().splitlines()[-1]
    if line.startswith("ERROR"):
        raise RuntimeError(line)
    return float(line)


def load_deepspeed_op():
    """DeepSpeed's compiled quantizer and version, or (None, reason)."""
    major, minor = torch.cuda.get_device_capability()
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", f"{major}.{minor}")  # DeepSpeed's import chokes on torch's "9.0a"
    os.environ.setdefault("DS_ACCELERATOR", "cuda")
    try:
        import deepspeed
        from deepspeed.ops.op_builder import QuantizerBuilder
        return QuantizerBuilder().load(), deepspeed.__version__
    except Exception as exc:
        return None, f"unavailable ({type(exc).__name__}: {str(exc).splitlines()[0][:100] if str(exc) else ''})"


def driver_version():
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True,
                             text=True,
                             check=True).stdout
        return out.strip().splitlines()[0]
    except (OSError, subprocess.CalledProcessError, IndexError):
        return "unknown"


def environment(ds_version):
    """What a result table names: GPU, driver, torch, CUDA, DeepSpeed and Python versions."""
    return dict(gpu=torch.cuda.get_device_name(),
                driver=driver_version(),
                torch=torch.__version__,
                cuda=torch.version.cuda,
                deepspeed=ds_version,
                python=platform.python_version())


def bench_dtype_size(dtype, numel, ours, ds_op, reps):
    groups, group_size = group_layout(numel)
    element = torch.finfo(dtype).bits // 8
    q_bytes = numel * element + numel + 4 * groups
    buffers = max(1, math.ceil(ROTATION_BYTES / q_bytes))
    xs = [torch.randn(numel, device="cuda").to(dtype) for _ in range(buffers)]
    wires = [ours.quantize(x, groups, group_size) for x in xs]
    row = {}
    row["ours_q"] = time_per_call(lambda x: ours.quantize(x, groups, group_size), xs, reps)
    row["ours_dq"] = time_per_call(lambda w: ours.dequantize(w[0], w[1], group_size, dtype), wires, reps)
    row["copy"] = time_per_call(lambda x: x.clone(), xs, reps)
    if ds_op is not None:
        sym = ds_op.Symmetric
        if dtype == torch.float16:
            ds_q = lambda x: ds_op.quantize(x, groups, 8, sym)  # noqa: E731
            ds_dq = lambda w: ds_op.dequantize(w[0], w[1], groups, 8, sym)  # noqa: E731
        else:  # DeepSpeed 0.19.8's CUDAQuantizer: cast to fp16 in, cast the fp16 result back out
            ds_q = lambda x: ds_op.quantize(x.to(torch.float16), groups, 8, sym)  # noqa: E731
            ds_dq = lambda w: ds_op.dequantize(w[0], w[1], groups, 8, sym).to(dtype)  # noqa: E731
        ds_wires = [(codes, scales.view(-1, 1)) for codes, scales in wires]
        row["ds_q"] = time_per_call(ds_q, xs, reps)
        row["ds_dq"] = time_per_call(ds_dq, ds_wires, reps)
    del xs, wires
    torch.cuda.empty_cache()
    gbps = {key: (2 * numel * element if key == "copy" else q_bytes) / seconds / 1e9 for key, seconds in row.items()}
    return groups, row, gbps


def meets_target(size_name, seconds, gbps):
    if size_name == "1M":
        return seconds <= 8e-6
    return gbps >= (3800 if size_name == "134M" else 3000)


def cell(row, gbps, key):
    return f"{gbps[key]:.0f} ({row[key] * 1e6:.1f} µs)" if key in row else "—"


def write_markdown(path, info, results, build):
    lines = [
        "# Quantizer kernels on one GPU", "",
        f"GPU: {info['gpu']} · driver {info['driver']} · torch {info['torch']} · CUDA {info['cuda']} · "
        f"DeepSpeed {info['deepspeed']} · Python {info['python']}", "",
        "Effective GB/s (µs per call): bytes a native kernel must move / time; quantize = input + int8 codes + "
        "fp32 scales, dequantize = codes + scales + output. DeepSpeed bf16/fp32 go through 0.19.8's fp16 detour "
        "(cast in, fp16 kernel, cast out). Copy = x.clone() of the input, counting bytes read and written.", "",
        f"Targets: {TARGETS}.", "",
        "| dtype | n | groups | ours Q | ours DQ | DeepSpeed Q | DeepSpeed DQ | copy | ours meets target |",
        "|---|---|---|---|---|---|---|---|---|"
    ]
    for (dtype_name, size_name), (groups, row, gbps) in results.items():
        ok = all(meets_target(size_name, row[k], gbps[k]) for k in ("ours_q", "ours_dq"))
        lines.append(f"| {dtype_name} | {size_name} | {groups} | {cell(row, gbps, 'ours_q')} | "
                     f"{cell(row, gbps, 'ours_dq')} | {cell(row, gbps, 'ds_q')} | {cell(row, gbps, 'ds_dq')} | "
                     f"{gbps['copy']:.0f} | {'yes' if ok else 'no'} |")
    lines.append("\n## JIT build\n")
    lines.append(f"- cold build (empty cache directory, new process): {build['cold']:.1f} s (target <= 30 s)")
    lines.append(f"- warm load (second process, cached build): {build['warm']:.2f} s (target <= 1 s)")
    lines.append("\nBoth exclude interpreter start, `import torch` and CUDA initialisation.\n")
    path.write_text("\n".join(lines))


def write_json(path, info, results, build):
    """Raw figures (seconds per call and GB/s), from which benchmarks/report_gpu.py rewrites the table and plot."""
    rows = [dict(dtype=d, size=n, groups=g, seconds=row, gbps=gbps) for (d, n), (g, row, gbps) in results.items()]
    path.write_text(json.dumps(dict(info=info, build=build, results=rows), indent=1))


def results_from_json(data):
    """The inverse of write_json: (info, results, build) as write_markdown and write_plot take them."""
    results = {(r["dtype"], r["size"]): (r["groups"], r["seconds"], r["gbps"]) for r in data["results"]}
    return data["info"], results, data["build"]


def write_plot(path, results):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    series = [("ours_q", "ours Q"), ("ours_dq", "ours DQ"), ("ds_q", "DeepSpeed Q"), ("ds_dq", "DeepSpeed DQ"),
              ("copy", "copy")]
    fig, axes = plt.subplots(1, len(DTYPES), figsize=(15, 4.5), sharey=True)
    for ax, dtype_name in zip(axes, DTYPES):
        width = 0.16
        for s, (key, label) in enumerate(series):
            values = [results[(dtype_name, size)][2].get(key, 0) for size in SIZES]
            ax.bar([i + (s - 2) * width for i in range(len(SIZES))], values, width, label=label)
        ax.set_xticks(range(len(SIZES)), list(SIZES))
        ax.set_title(dtype_name)
        ax.axhline(3800, color="grey", linestyle="--", linewidth=0.8)
    axes[0].set_ylabel("effective GB/s")
    axes[0].legend(fontsize=8)
    fig.suptitle("int8 quantize / dequantize (dashed: 3800 GB/s target at 134M)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks") / "results")
    parser.add_argument("--reps", type=int, default=50, help="back-to-back calls per timed trial")
    args = parser.parse_args(argv)
    return run(args.out, args.reps)


def run(out, reps=50):
    if not torch.cuda.is_available():
        print("bench: the kernel benchmarks need a CUDA GPU; none is visible here")
        return 2
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)

    torch.cuda.init()
    with tempfile.TemporaryDirectory() as cache:
        build = {"cold": timed_load(cache), "warm": timed_load(cache)}
        os.environ["DEEPSPEED_ZEROPP_CACHE"] = cache
        from deepspeed_zeropp.backends import cuda as ours
        assert ours.load_error() is None, ours.load_error()
    print(f"cold build {build['cold']:.1f} s, warm load {build['warm']:.2f} s", flush=True)

    ds_op, ds_version = load_deepspeed_op()
    info = environment(ds_version)
    results = {}
    for dtype_name, dtype in DTYPES.items():
        for size_name, numel in SIZES.items():
            results[(dtype_name, size_name)] = bench_dtype_size(dtype, numel, ours, ds_op, reps)
            groups, row, gbps = results[(dtype_name, size_name)]
            summary = {key: f"{value:.0f} GB/s {row[key] * 1e6:.1f} us" for key, value in gbps.items()}
            print(dtype_name, size_name, summary, flush=True)
    write_json(out / "kernels_h200.json", info, results, build)
    write_markdown(out / "kernels_h200.md", info, results, build)
    if write_plot(out / "kernels_h200.png", results):
        print(f"wrote {out / 'kernels_h200.png'}")
    print(f"wrote {out / 'kernels_h200.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
