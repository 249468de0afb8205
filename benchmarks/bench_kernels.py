"""Kernel benchmark: our CUDA quantizer against DeepSpeed's compiled fp16 op and the device copy, in one process.

Three parts, each printed as ratios with their spread:

- Bandwidth: effective GB/s (bytes a native kernel must move / time: input + int8 codes + fp32 scales for
  quantize, codes + scales + output for dequantize; a copy, x.clone(), moves the input's bytes in and out), for
  every dtype at 16M and 134M elements, in the groups DeepSpeed's heuristic picks and in groups of 2048. The
  functions run interleaved: each trial times every one of them once, the order rotated by one each trial (A B C,
  B C A, C A B, ...), so a ratio compares figures taken side by side and no function always follows the same one
  (what ran before moved a kernel's figure by up to 9% on H200); the spread is the min-max over trials. Inputs
  rotate over enough buffers to exceed the L2 cache several times.
- Host overhead: wall time per call of ``ops.quantize``, ``ops.dequantize``, ``ops.dequantize_gathered`` and
  ``ops.quantize_packed`` (the paths the patched DeepSpeed calls, checks included), each also with the checks run
  on every call (what ops' signature tables save), against DeepSpeed's op called directly and our extension's
  entry points called directly, back to back at 1M fp16 elements, interleaved per trial.
- JIT build: cold build and warm load times of the extension in fresh processes.

    python benchmarks/bench_kernels.py [--out DIR]      (default DIR: benchmarks/results)

writes kernels_<gpu>.md, .json (and .png when matplotlib is available) into DIR; DeepSpeed's op needs an
installed DeepSpeed (its columns are left empty otherwise). The timing helpers are benchmarks/common.py's.
"""
import argparse
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]  # so the timed subprocesses import this same copy of the package
sys.path.insert(0, str(REPO))
from deepspeed_zeropp.formats.dtypes import BY_NAME as DTYPES  # noqa: E402
from deepspeed_zeropp.formats.grouping import equal_groups, group_layout  # noqa: E402
from benchmarks.common import environment, interleaved, paired_ratio  # noqa: E402

SIZES = {"16M": 2**24, "134M": 2**27}
LAYOUTS = {"heuristic": group_layout, "2048": lambda numel: (numel // 2048, 2048)}
HOST_NUMEL = 2**20
HOST_OPS = ("quantize", "dequantize", "dequantize_gathered", "quantize_packed")  # ops timed for host time
ROTATION_BYTES = 512 * 2**20  # several times the H200's 60 MB L2
COPY_SHARE = 0.95  # at 134M: quantize and dequantize reach this share of the copy's effective bandwidth
TARGETS = (f"quantize and dequantize, every dtype, both layouts: >= DeepSpeed's fp16 op at 16M and 134M, "
           f">= {COPY_SHARE:.0%} of the copy at 134M; host time per call at 1M <= DeepSpeed's op")
LOAD_SNIPPET = ("import time, torch; torch.cuda.init(); t = time.perf_counter(); "
                "from deepspeed_zeropp.backends import cuda; error = cuda.load_error(); "
                "print(time.perf_counter() - t if error is None else 'ERROR ' + error)")


def timed_load(cache_dir):
    """Seconds a fresh process spends in load_error() (CUDA initialised beforehand) with the given build cache."""
    env = dict(os.environ, DEEPSPEED_ZEROPP_CACHE=str(cache_dir))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
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


def summary(samples, nbytes):
    """Median GB/s and the min-max over trials."""
    rates = [nbytes / s / 1e9 for s in samples]
    return {"gbps": statistics.median(rates), "low": min(rates), "high": max(rates)}


def bench_bandwidth(dtype, numel, layout, ours, ds_op, reps, trials):
    groups, group_size = layout(numel)
    element = torch.finfo(dtype).bits // 8
    q_bytes = numel * element + numel + 4 * groups
    buffers = max(1, math.ceil(ROTATION_BYTES / q_bytes))
    xs = [torch.randn(numel, device="cuda").to(dtype) for _ in range(buffers)]
    wires = [ours.quantize(x, groups, group_size) for x in xs]
    equal = equal_groups(group_size)  # dequantize's layout: one buffer, equal groups
    functions = {
        "ours_q": (lambda x: ours.quantize(x, groups, group_size), xs),
        "ours_dq": (lambda w: ours.dequantize(w[0], w[1], equal, dtype), wires),
        "copy": (lambda x: x.clone(), xs),
    }
    fp16_q_bytes = numel * 2 + numel + 4 * groups
    if ds_op is not None:  # always its fp16 kernels: the speed to match in every dtype
        xs16 = xs if dtype == torch.float16 else [
            torch.randn(numel, device="cuda", dtype=torch.float16)
            for _ in range(math.ceil(ROTATION_BYTES / fp16_q_bytes))
        ]
        ds_wires = [(codes, scales.view(-1, 1)) for codes, scales in wires]
        functions["ds_fp16_q"] = (lambda x: ds_op.quantize(x, groups, 8, ds_op.Symmetric), xs16)
        functions["ds_fp16_dq"] = (lambda w: ds_op.dequantize(w[0], w[1], groups, 8, ds_op.Symmetric), ds_wires)
    for fn, inputs in functions.values():
        for i in range(10):
            fn(inputs[i % len(inputs)])
    samples = interleaved(functions, reps, trials)
    del xs, wires, functions
    xs16 = ds_wires = None
    torch.cuda.empty_cache()
    nbytes = dict(ours_q=q_bytes,
                  ours_dq=q_bytes,
                  copy=2 * numel * element,
                  ds_fp16_q=fp16_q_bytes,
                  ds_fp16_dq=fp16_q_bytes)
    row = {"groups": groups, "group_size": group_size, "trials": trials}
    row["gbps"] = {key: summary(times, nbytes[key]) for key, times in samples.items()}
    # Ratios of effective bandwidth, trial by trial: to DeepSpeed's fp16 op and to the copy.
    for op in ("q", "dq"):
        mine = [nbytes[f"ours_{op}"] / s for s in samples[f"ours_{op}"]]
        if f"ds_fp16_{op}" in samples:
            theirs = [nbytes[f"ds_fp16_{op}"] / s for s in samples[f"ds_fp16_{op}"]]
            row[f"{op}_vs_ds"] = paired_ratio(theirs, mine)
        copies = [nbytes["copy"] / s for s in samples["copy"]]
        row[f"{op}_vs_copy"] = paired_ratio(copies, mine)
    return row


def bench_host(ds_op, calls=2000, trials=9):
    """Host microseconds per call, back to back (one synchronize after ``calls`` calls), at 1M fp16 elements,
    interleaved per trial (the order rotated by one each trial). Each ``ops`` function twice: as called (a
    remembered call signature after the first call) and with every call taking the checked path (``ops``' lookup
    made to miss), which is what the tables save. The extension's entry points called directly show what ops
    adds; DeepSpeed's op is the figure to match."""
    from deepspeed_zeropp import ops
    from deepspeed_zeropp.backends import cuda
    x = torch.randn(HOST_NUMEL, device="cuda", dtype=torch.float16)
    groups, group_size = group_layout(HOST_NUMEL)
    codes, scales = ops.quantize(x)
    scales = scales.view(-1, 1)  # as DeepSpeed hands them to dequantize
    ext_quantize, quantize_args = cuda.bind_quantize(groups, group_size)
    ext_dequantize, dequantize_args = cuda.bind_dequantize(equal_groups(group_size), torch.float16)
    gathered = equal_groups(group_size)
    functions = {
        "ops_quantize": lambda: ops.quantize(x),
        "ops_dequantize": lambda: ops.dequantize(codes, scales, torch.float16),
        "ops_dequantize_gathered": lambda: ops.dequantize_gathered(codes, scales, gathered, torch.float16),
        "ops_quantize_packed": lambda: ops.quantize_packed(x),
        "ext_quantize": lambda: ext_quantize(x, *quantize_args),
        "ext_dequantize": lambda: ext_dequantize(codes, scales, *dequantize_args),
    }
    for name in [name for name in functions if name.startswith("ops_")]:
        functions[f"{name}_checked"] = functions[name]
    if ds_op is not None:
        functions["ds_quantize"] = lambda: ds_op.quantize(x, groups, 8, ds_op.Symmetric)
        functions["ds_dequantize"] = lambda: ds_op.dequantize(codes, scales, groups, 8, ds_op.Symmetric)
    recall = ops._recall
    samples = {name: [] for name in functions}
    for fn in functions.values():
        for _ in range(200):
            fn()
    torch.cuda.synchronize()
    order = list(functions.items())
    for trial in range(trials):
        shift = trial % len(order)
        for name, fn in order[shift:] + order[:shift]:
            if name.endswith("_checked"):
                ops._recall = lambda *arguments: (None, None)
            try:
                start = time.perf_counter()
                for _ in range(calls):
                    fn()
                torch.cuda.synchronize()
                samples[name].append((time.perf_counter() - start) / calls)
            finally:
                ops._recall = recall
    result = {
        name: {
            "us": statistics.median(s) * 1e6,
            "low": min(s) * 1e6,
            "high": max(s) * 1e6
        }
        for name, s in samples.items()
    }
    if ds_op is not None:
        for op in ("quantize", "dequantize"):
            result[f"{op}_vs_ds"] = paired_ratio(samples[f"ops_{op}"], samples[f"ds_{op}"])
    for op in HOST_OPS:  # time checked / remembered: what a table saves, as a factor
        result[f"{op}_table"] = paired_ratio(samples[f"ops_{op}"], samples[f"ops_{op}_checked"])
    return result


def _fmt_ratio(entry):
    return f"{entry['ratio']:.3f} ({entry['low']:.3f}-{entry['high']:.3f})" if entry else "—"


def _meets(rows, host):
    """Each target, met or not, from the figures: (text, met) pairs."""
    checks = []
    for row in rows:
        for op in ("q", "dq"):
            where = f"{row['dtype']} {row['size']} {row['layout']} {'quantize' if op == 'q' else 'dequantize'}"
            if f"{op}_vs_ds" in row:
                checks.append((f"{where} >= DeepSpeed fp16", row[f"{op}_vs_ds"]["ratio"] >= 1.0))
            if row["size"] == "134M":
                checks.append((f"{where} >= {COPY_SHARE:.0%} copy", row[f"{op}_vs_copy"]["ratio"] >= COPY_SHARE))
    for op in ("quantize", "dequantize"):
        if f"{op}_vs_ds" in host:  # time ratio ds / ours >= 1: ours no slower
            checks.append((f"host time of ops.{op} <= DeepSpeed's op", host[f"{op}_vs_ds"]["ratio"] >= 1.0))
    return checks


def write_markdown(path, info, rows, host, build):
    lines = [
        "# Quantizer kernels on one GPU", "",
        f"GPU: {info['gpu']} · driver {info['driver']} · torch {info['torch']} · CUDA {info['cuda']} · "
        f"DeepSpeed {info['deepspeed']} · Python {info['python']} · commit {info['commit']}", "",
        "Effective GB/s, median over interleaved trials (each times every function once, the order rotated by one "
        "each trial) with the min-max: bytes a native kernel must move / time; "
        "quantize = input + int8 codes + fp32 scales, dequantize = codes + scales + output. DeepSpeed = its "
        "compiled fp16 op on fp16 data of the same size and groups (the speed to match in every dtype). "
        "Copy = x.clone() of the input, bytes read and written. Ratios are taken trial by trial.", "",
        f"Targets: {TARGETS}.", "",
        "| dtype | n | groups (size) | ours Q | ours DQ | DeepSpeed fp16 Q | DeepSpeed fp16 DQ | copy | "
        "Q / DeepSpeed | DQ / DeepSpeed | Q / copy | DQ / copy |", "|---|---|---|---|---|---|---|---|---|---|---|---|"
    ]

    def gb(row, key):
        entry = row["gbps"].get(key)
        return f"{entry['gbps']:.0f} ({entry['low']:.0f}-{entry['high']:.0f})" if entry else "—"

    for row in rows:
        lines.append(f"| {row['dtype']} | {row['size']} | {row['groups']} ({row['group_size']}, {row['layout']}) | "
                     f"{gb(row, 'ours_q')} | {gb(row, 'ours_dq')} | {gb(row, 'ds_fp16_q')} | {gb(row, 'ds_fp16_dq')} "
                     f"| {gb(row, 'copy')} | {_fmt_ratio(row.get('q_vs_ds'))} | {_fmt_ratio(row.get('dq_vs_ds'))} | "
                     f"{_fmt_ratio(row['q_vs_copy'])} | {_fmt_ratio(row['dq_vs_copy'])} |")
    lines += [
        "", f"## Host time per call ({HOST_NUMEL} fp16 elements, back to back, median (min-max) of trials)", "",
        "| call | µs per call | DeepSpeed's op / ours |", "|---|---|---|"
    ]
    for op in HOST_OPS:
        ours, checked = host[f"ops_{op}"], host[f"ops_{op}_checked"]
        lines.append(f"| ops.{op} | {ours['us']:.2f} ({ours['low']:.2f}-{ours['high']:.2f}) | "
                     f"{_fmt_ratio(host.get(f'{op}_vs_ds'))} |")
        lines.append(f"| ops.{op}, checks on every call (no table; checked / remembered: "
                     f"{_fmt_ratio(host[f'{op}_table'])}) | {checked['us']:.2f} ({checked['low']:.2f}-"
                     f"{checked['high']:.2f}) | |")
        theirs = host.get(f"ds_{op}")
        if theirs:
            lines.append(f"| DeepSpeed op {op} | {theirs['us']:.2f} ({theirs['low']:.2f}-{theirs['high']:.2f}) | |")
        if f"ext_{op}" in host:
            t = host[f"ext_{op}"]
            lines.append(f"| extension {op}: pybind entry point | {t['us']:.2f} ({t['low']:.2f}-{t['high']:.2f}) | |")
    checks = _meets(rows, host)
    missed = [text for text, met in checks if not met]
    lines += ["", f"## Targets: {len(checks) - len(missed)} of {len(checks)} met", ""]
    lines += [f"- missed: {text}" for text in missed] or ["- all met"]
    lines += [
        "", "## JIT build", "", f"- cold build (empty cache directory, new process): {build['cold']:.1f} s",
        f"- warm load (second process, cached build): {build['warm']:.2f} s", "",
        "Both exclude interpreter start, `import torch` and CUDA initialisation.", ""
    ]
    path.write_text("\n".join(lines))


def write_plot(path, rows):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    series = [("ours_q", "ours Q"), ("ours_dq", "ours DQ"), ("ds_fp16_q", "DeepSpeed fp16 Q"),
              ("ds_fp16_dq", "DeepSpeed fp16 DQ"), ("copy", "copy")]
    fig, axes = plt.subplots(1, len(DTYPES), figsize=(16, 4.5), sharey=True)
    for ax, dtype_name in zip(axes, DTYPES):
        mine = [r for r in rows if r["dtype"] == dtype_name]
        width = 0.16
        for s, (key, label) in enumerate(series):
            values = [r["gbps"][key]["gbps"] if key in r["gbps"] else 0 for r in mine]
            errors = [[r["gbps"][key]["gbps"] - r["gbps"][key]["low"] if key in r["gbps"] else 0 for r in mine],
                      [r["gbps"][key]["high"] - r["gbps"][key]["gbps"] if key in r["gbps"] else 0 for r in mine]]
            ax.bar([i + (s - 2) * width for i in range(len(mine))], values, width, yerr=errors, label=label)
        ax.set_xticks(range(len(mine)), [f"{r['size']}\n{r['layout']}" for r in mine])
        ax.set_title(dtype_name)
    axes[0].set_ylabel("effective GB/s (bars: min-max over trials)")
    axes[0].legend(fontsize=8)
    fig.suptitle("int8 quantize / dequantize against DeepSpeed's fp16 op and the copy")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


def gpu_tag():
    return re.sub(r"[^a-z0-9]+", "_", torch.cuda.get_device_name().lower()).strip("_")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    parser.add_argument("--reps", type=int, default=40, help="back-to-back calls per timed trial")
    parser.add_argument("--trials", type=int, default=9)
    parser.add_argument("--name", help="file name stem of the results (default: kernels_<gpu>)")
    args = parser.parse_args(argv)
    return run(args.out, args.reps, args.trials, args.name)


def run(out, reps=40, trials=9, name=None):
    if not torch.cuda.is_available():
        print("bench: the kernel benchmarks need a CUDA GPU; none is visible here")
        return 2
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)

    torch.cuda.init()
    with tempfile.TemporaryDirectory() as cache:
        build = {"cold": timed_load(cache), "warm": timed_load(cache)}
    from deepspeed_zeropp.backends import cuda as ours
    assert ours.load_error() is None, ours.load_error()
    print(f"cold build {build['cold']:.1f} s, warm load {build['warm']:.2f} s", flush=True)

    ds_op, ds_version = load_deepspeed_op()
    info = environment(ds_version)
    host = bench_host(ds_op)
    print("host", json.dumps(host), flush=True)
    rows = []
    for dtype_name, dtype in DTYPES.items():
        for size_name, numel in SIZES.items():
            for layout_name, layout in LAYOUTS.items():
                row = bench_bandwidth(dtype, numel, layout, ours, ds_op, reps, trials)
                row.update(dtype=dtype_name, size=size_name, layout=layout_name)
                rows.append(row)
                print(dtype_name,
                      size_name,
                      layout_name, {
                          k: round(v["gbps"])
                          for k, v in row["gbps"].items()
                      }, {k: round(row[k]["ratio"], 3)
                          for k in row if k.endswith(("_vs_ds", "_vs_copy"))},
                      flush=True)
    stem = name or f"kernels_{gpu_tag()}"
    (out / f"{stem}.json").write_text(json.dumps(dict(info=info, build=build, host=host, results=rows), indent=1))
    write_markdown(out / f"{stem}.md", info, rows, host, build)
    if write_plot(out / f"{stem}.png", rows):
        print(f"wrote {out / (stem + '.png')}")
    for text, met in _meets(rows, host):
        print(("met    " if met else "MISSED ") + text)
    print(f"wrote {out / (stem + '.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
