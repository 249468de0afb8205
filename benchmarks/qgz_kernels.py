"""qgZ codec kernels on one GPU: ours (csrc/qgz.cu) vs DeepSpeed's op (fp16) vs our pure-torch codec, per step.

The three steps of one rank's reduce-scatter in a 16-rank job (2 nodes x 8 GPUs), without the all-to-alls: each
step's input has the shape the all-to-all would deliver. DeepSpeed's steps are the calls its
``all_to_all_quant_reduce`` makes (swizzle_quant; quantized_reduction; dequantize, then the sum over nodes / nodes in
torch), fed fp16 gradients, the one dtype it handles. Effective GB/s = bytes the step must read and write / time.
Times: median over trials of the mean of back-to-back calls (CUDA events), inputs rotated to exceed L2.

    python benchmarks/qgz_kernels.py [--out benchmarks/results]      (a CUDA GPU; DeepSpeed optional)
writes qgz_kernels_h200.{json,md,png}.
"""
import argparse
import json
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from deepspeed_zeropp.formats import int4  # noqa: E402
from deepspeed_zeropp.backends import cuda as ours  # noqa: E402
from deepspeed_zeropp.formats.dtypes import BY_NAME as DTYPES  # noqa: E402
from benchmarks.bench_kernels import load_deepspeed_op  # noqa: E402
from benchmarks.common import environment, time_per_call  # noqa: E402

NODES, LOCAL = 2, 8
WORLD = NODES * LOCAL
SHAPES = {"1M": (1024, 1024), "16M": (4096, 4096), "67M": (8192, 8192)}
STEPS = ("encode", "reduce", "decode")
ROTATION_BYTES = 512 * 2**20


def rotated(make, nbytes):
    return [make() for _ in range(max(2, math.ceil(ROTATION_BYTES / max(nbytes, 1))))]


def step_bytes(numel, element):
    chunk = math.ceil(numel / WORLD)
    padded = math.ceil(chunk / int4.GROUP) * int4.GROUP
    sent = LOCAL * int4.block_bytes(NODES, padded)
    reduced = NODES * int4.block_bytes(1, padded)
    return {"encode": numel * element + sent, "reduce": sent + reduced, "decode": reduced + chunk * element}


def ours_steps(codec, numel, dtype, reps):
    chunk = math.ceil(numel / WORLD)
    padded = math.ceil(chunk / int4.GROUP) * int4.GROUP
    element = torch.finfo(dtype).bits // 8
    xs = rotated(lambda: torch.randn(numel, device="cuda").to(dtype), numel * element)
    one_sent = codec.qgz_encode(xs[0], LOCAL, NODES, chunk, padded)
    sent = rotated(one_sent.clone, one_sent.numel())
    one_reduced = codec.qgz_reduce_encode(one_sent, NODES, padded)
    reduced = rotated(one_reduced.clone, one_reduced.numel())
    times = {
        "encode": time_per_call(lambda x: codec.qgz_encode(x, LOCAL, NODES, chunk, padded), xs, reps),
        "reduce": time_per_call(lambda b: codec.qgz_reduce_encode(b, NODES, padded), sent, reps),
        "decode": time_per_call(lambda b: codec.qgz_decode_sum(b, padded, chunk, 1 / 16, dtype), reduced, reps),
    }
    del xs, sent, reduced
    torch.cuda.empty_cache()
    return times


def deepspeed_steps(op, shape, reps):
    numel = shape[0] * shape[1]
    group = max(shape[0], shape[1], WORLD)  # DeepSpeed's intra_quant_group
    sym = op.Symmetric
    xs = rotated(lambda: torch.randn(shape, device="cuda", dtype=torch.float16), numel * 2)
    codes, scales = op.swizzle_quant(xs[0], group, 4, sym, 1, NODES, LOCAL)
    sent = rotated(lambda: (codes.clone(), scales.clone()), codes.numel())
    reduced_codes, reduced_scales = op.quantized_reduction(codes, scales, group, group // LOCAL, 4, sym, LOCAL)
    reduced = rotated(lambda: (reduced_codes.clone(), reduced_scales.clone()), reduced_codes.numel())

    def decode(pair):
        values = op.dequantize(pair[0], pair[1], pair[1].numel(), 4, sym)
        return (sum(list(values.chunk(NODES))) / NODES).view(-1)

    times = {
        "encode":
        time_per_call(lambda x: op.swizzle_quant(x, group, 4, sym, 1, NODES, LOCAL), xs, reps),
        "reduce":
        time_per_call(lambda p: op.quantized_reduction(p[0], p[1], group, group // LOCAL, 4, sym, LOCAL), sent, reps),
        "decode":
        time_per_call(decode, reduced, reps),
    }
    del xs, sent, reduced
    torch.cuda.empty_cache()
    return times


def measure(reps):
    assert ours.load_error() is None, ours.load_error()
    ds_op, ds_version = load_deepspeed_op()
    from deepspeed_zeropp.backends import torch_ref
    rows = []
    for size, shape in SHAPES.items():
        numel = shape[0] * shape[1]
        for dtype_name, dtype in DTYPES.items():
            element = torch.finfo(dtype).bits // 8
            row = {"size": size, "dtype": dtype_name, "bytes": step_bytes(numel, element)}
            row["ours"] = ours_steps(ours, numel, dtype, reps)
            row["torch"] = ours_steps(torch_ref, numel, dtype, max(2, reps // 10))
            if ds_op is not None and dtype == torch.float16:
                try:
                    row["deepspeed"] = deepspeed_steps(ds_op, shape, reps)
                except RuntimeError as exc:  # recorded, not fatal: the other rows still get measured
                    row["deepspeed_error"] = str(exc).splitlines()[0][:200]
            rows.append(row)
            print(size, dtype_name, {k: v for k, v in row.items() if k in ("ours", "torch", "deepspeed")}, flush=True)
    info = environment(ds_version)
    return {"info": info, "topology": {"nodes": NODES, "local": LOCAL}, "rows": rows}


def cell(row, impl, step):
    if impl not in row:
        return "—"
    seconds = row[impl][step]
    return f"{seconds * 1e6:.1f} µs ({row['bytes'][step] / seconds / 1e9:.0f} GB/s)"


def render(data):
    info = data["info"]
    lines = [
        "# qgZ codec kernels on one GPU", "",
        f"GPU: {info['gpu']} · driver {info['driver']} · torch {info['torch']} · CUDA {info['cuda']} · "
        f"DeepSpeed {info['deepspeed']} · commit {info.get('commit', 'unknown')}", "",
        f"One rank's steps of a reduce-scatter in a {WORLD}-rank job ({NODES} nodes x {LOCAL} GPUs), all-to-alls "
        "left out: encode (gradient -> 4-bit blocks for the 8 node-local peers), reduce (8 received blocks -> fp32 "
        "sum -> 4-bit blocks for the 2 nodes), decode (2 received blocks -> fp32 sum / 16 -> gradient dtype). "
        "DeepSpeed: swizzle_quant, quantized_reduction, dequantize + torch sum over nodes, on fp16 only (it reads "
        "every gradient as fp16). torch: our pure-torch codec on the GPU (what ran before the kernels). "
        "Time per call (effective GB/s: bytes the step must read and write).", "",
        "| gradient | dtype | step | ours (CUDA) | DeepSpeed (fp16 kernels) | ours (pure torch) |",
        "|---|---|---|---|---|---|"
    ]
    for row in data["rows"]:
        for step in STEPS:
            lines.append(f"| {row['size']} | {row['dtype']} | {step} | {cell(row, 'ours', step)} | "
                         f"{cell(row, 'deepspeed', step)} | {cell(row, 'torch', step)} |")
        total = {impl: sum(row[impl].values()) * 1e6 for impl in ("ours", "deepspeed", "torch") if impl in row}
        lines.append(f"| {row['size']} | {row['dtype']} | **all three** | **{total['ours']:.1f} µs** | "
                     f"{'%.1f µs' % total['deepspeed'] if 'deepspeed' in total else '—'} | {total['torch']:.1f} µs |")
    return "\n".join(lines) + "\n"


def plot(data, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    rows = [r for r in data["rows"] if r["size"] != "1M"]
    labels = [f"{r['size']} {r['dtype']}" for r in rows]
    fig, ax = plt.subplots(figsize=(11, 4.5))
    width = 0.27
    for i, (impl, name) in enumerate(
        (("ours", "ours (CUDA)"), ("deepspeed", "DeepSpeed (fp16 only)"), ("torch", "ours (pure torch)"))):
        values = [sum(r[impl].values()) * 1e6 if impl in r else 0 for r in rows]
        ax.bar([x + (i - 1) * width for x in range(len(rows))], values, width, label=name)
    ax.set_xticks(range(len(rows)), labels)
    ax.set_yscale("log")
    ax.set_ylabel("µs per reduce-scatter (encode + reduce + decode)")
    ax.set_title(f"qgZ codec, one rank of {NODES} nodes x {LOCAL} GPUs, all-to-alls excluded")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    parser.add_argument("--reps", type=int, default=50)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("qgz_kernels: needs a CUDA GPU")
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    data = measure(args.reps)
    (args.out / "qgz_kernels_h200.json").write_text(json.dumps(data, indent=1))
    (args.out / "qgz_kernels_h200.md").write_text(render(data))
    plot(data, args.out / "qgz_kernels_h200.png")
    print(render(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
