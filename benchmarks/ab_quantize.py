"""A/B of two builds of the quantizer (a reference copy of csrc/ vs the working csrc/), plus per-call GPU time at 1M.

    python benchmarks/ab_quantize.py --old DIR_WITH_OLD_SOURCES --json OUT.json

Both builds are timed in alternating trials on the same buffers (quantize, fp16 and bf16, 16M and 134M elements),
and the codes and scales of the two must be identical. The 1M figures replay 50 calls captured in a CUDA graph, so
they show the GPU's own time per call without the host's launch cost; the host-bound figure (eager calls) is what
bench_kernels.py reports.
"""
import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
from deepspeed_zeropp.backends import cuda as new  # noqa: E402
from deepspeed_zeropp.grouping import group_layout  # noqa: E402

SIZES = {"16M": 2**24, "134M": 2**27}
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


def load_old(source_dir):
    from torch.utils.cpp_extension import load
    src = Path(source_dir)
    build = tempfile.mkdtemp(prefix="dszpp_ab_old_")
    start = time.perf_counter()
    module = load(name="dszpp_ab_old",
                  sources=[str(src / n) for n in new.SOURCES],
                  extra_include_paths=[str(src)],
                  extra_cflags=["-O3"],
                  extra_cuda_cflags=["-O3"],
                  build_directory=build,
                  verbose=False)
    return module, time.perf_counter() - start


def mean_call_seconds(fn, inputs, reps=50):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for i in range(reps):
        fn(inputs[i % len(inputs)])
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / reps


def graph_call_seconds(fn, inputs, reps=50, trials=5):
    """GPU time per call: ``reps`` calls captured once in a CUDA graph, replayed ``trials`` times (median)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for i in range(3):
            fn(inputs[i % len(inputs)])
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(reps):
            fn(inputs[i % len(inputs)])
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = []
    for _ in range(trials):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / 1e3 / reps)
    return statistics.median(samples)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--old", required=True)
    parser.add_argument("--json", type=Path, required=True)
    args = parser.parse_args()
    torch.cuda.init()
    assert new.load_error() is None, new.load_error()
    report = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "ab": [], "graph_1M": []}
    try:
        old, seconds = load_old(args.old)
        report["old_build_s"] = seconds
    except Exception as exc:
        old = None
        report["old_error"] = f"{type(exc).__name__}: {str(exc)[:500]}"
    if old is not None:
        for dtype_name in ("fp16", "bf16"):
            dtype = DTYPES[dtype_name]
            for size_name, numel in SIZES.items():
                groups = group_layout(numel).groups
                xs = [torch.randn(numel, device="cuda").to(dtype) for _ in range(max(2, 2**29 // (3 * numel)))]
                a, b = old.quantize(xs[0], groups), new.quantize(xs[0], groups)
                identical = bool(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]))
                variants = {"old": lambda x: old.quantize(x, groups), "new": lambda x: new.quantize(x, groups)}
                for fn in variants.values():
                    for i in range(3):
                        fn(xs[i % len(xs)])
                samples = {k: [] for k in variants}
                for _ in range(9):
                    for key, fn in variants.items():
                        samples[key].append(mean_call_seconds(fn, xs))
                q_bytes = numel * (torch.finfo(dtype).bits // 8) + numel + 4 * groups
                row = {"dtype": dtype_name, "size": size_name, "identical": identical}
                for key, values in samples.items():
                    row[f"{key}_s"] = statistics.median(values)
                    row[f"{key}_gbps"] = q_bytes / row[f"{key}_s"] / 1e9
                report["ab"].append(row)
                print(row, flush=True)
                del xs
                torch.cuda.empty_cache()
    numel = 2**20
    groups = group_layout(numel).groups
    for dtype_name, dtype in DTYPES.items():
        xs = [torch.randn(numel, device="cuda").to(dtype) for _ in range(64)]
        wires = [new.quantize(x, groups) for x in xs]
        row = {"dtype": dtype_name, "size": "1M"}
        row["q_graph_s"] = graph_call_seconds(lambda x: new.quantize(x, groups), xs)
        row["dq_graph_s"] = graph_call_seconds(lambda w: new.dequantize(w[0], w[1], numel // groups, dtype), wires)
        row["copy_graph_s"] = graph_call_seconds(lambda x: x.clone(), xs)
        row["q_eager_s"] = statistics.median(
            mean_call_seconds(lambda x: new.quantize(x, groups), xs) for _ in range(7))
        row["copy_eager_s"] = statistics.median(mean_call_seconds(lambda x: x.clone(), xs) for _ in range(7))
        row["empty_eager_s"] = statistics.median(
            mean_call_seconds(lambda x: torch.empty(numel, dtype=dtype, device="cuda"), xs) for _ in range(7))
        report["graph_1M"].append(row)
        print({k: (f"{v * 1e6:.2f} us" if k.endswith("_s") else v) for k, v in row.items()}, flush=True)
    args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
