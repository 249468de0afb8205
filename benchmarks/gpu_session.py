"""End-to-end GPU runs of the training harness (issues 3 and 6), one JSON file per stage.

    python benchmarks/gpu_session.py --stages B+C1,C2,C3 --out DIR --ds-root DIR [--deadline EPOCH_SECONDS]

``--ds-root`` holds one pip --target directory per DeepSpeed release (``ds-0.19.5``, ``ds-0.19.8``) plus ``site``
(their pure-Python dependencies); each job runs with that release first on PYTHONPATH and its own
TORCH_EXTENSIONS_DIR (``tx-VERSION``), so builds of DeepSpeed's op from different releases never mix. Stages:

- B: 2 ranks sharing GPU 0 over gloo, BERT (#7775 shape) bf16, patched, backend auto, 20 steps, baseline vs qwZ.
- C1: NCCL on 2 GPUs, DeepSpeed 0.19.5: unpatched BERT bf16 qwZ (the upstream failure), then patched (trains).
- C2: NCCL, 0.19.8 patched, >= 50 steps, BERT and GPT-2 in bf16 and fp32, baseline vs qwZ (jobs run concurrently:
  only losses matter here).
- C3: NCCL, GPT-2 bf16, checks off, 30 steps, one job at a time: 0.19.8 patched, 0.19.8 unpatched (upstream's
  fp16 detour), 0.19.5 patched; each job runs the unquantized baseline and qwZ.

benchmarks/report_gpu.py turns the JSON into benchmarks/results/e2e_gpu.md and loss_parity.png.
"""
import argparse
import concurrent.futures
import json
import os
import sys
import tempfile
import threading
import time
import types
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
from deepspeed_zeropp._harness import launch  # noqa: E402

JOURNAL = None
_journal_lock = threading.Lock()
RUNS = [{"name": "baseline", "quantized": False}, {"name": "qwz", "quantized": True}]
_workdirs = {}


def _mkdtemp(*args, **kwargs):
    """launch.run_job's work directory, remembered per thread: a failed job's result.json and rank logs are read."""
    path = tempfile.mkdtemp(*args, **kwargs)
    _workdirs[threading.get_ident()] = path
    return path


launch.tempfile = types.SimpleNamespace(mkdtemp=_mkdtemp)


def version_env(ds_root, version):
    root = Path(ds_root)
    return {
        "PYTHONPATH": os.pathsep.join([str(root / f"ds-{version}"),
                                       str(root / "site"),
                                       str(REPO_ROOT)]),
        "TORCH_EXTENSIONS_DIR": str(root / f"tx-{version}"),
        "TORCH_CUDA_ARCH_LIST": "9.0",
        "NCCL_NVLS_ENABLE": "0",
        "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
        "NVSHMEM_DISABLE_NVLS": "1",
    }


def job(label, spec, device, version, ds_root, timeout):
    """Run one harness job; never raises: the record holds the result or the failure, and the rank log tails."""
    record = {"label": label, "spec": spec, "device": device, "deepspeed_requested": version}
    start = time.monotonic()
    try:
        record["result"] = launch.run_job(spec,
                                          world_size=2,
                                          timeout=timeout,
                                          env=version_env(ds_root, version),
                                          device=device)
    except Exception as exc:
        record["job_error"] = f"{type(exc).__name__}: {str(exc)[-6000:]}"
        workdir = _workdirs.get(threading.get_ident())
        result = Path(workdir or "/nonexistent") / "result.json"
        if result.exists():
            record["result"] = json.loads(result.read_text())
    workdir = _workdirs.get(threading.get_ident())
    if workdir:
        for rank in (0, 1):
            log = Path(workdir) / f"rank{rank}.log"
            if log.exists():
                record[f"rank{rank}_log_tail"] = log.read_text()[-3000:]
    record["wall_s"] = time.monotonic() - start
    summary = {}
    for name, run in record.get("result", {}).get("runs", {}).items():
        summary[name] = run.get("error") or {
            "first_losses": [round(x, 4) for x in run["losses"][:3]],
            "last_loss": round(run["losses"][-1], 4) if run["losses"] else None,
            "median_step_ms": sorted(run["step_ms"])[len(run["step_ms"]) // 2] if run["step_ms"] else None,
            "counts": run.get("counts"),
            "dtype_errors": len(run.get("dtype_errors", [])),
            "value_errors": len(run.get("value_errors", [])),
        }
    if JOURNAL is not None:  # every record as soon as it exists: a stage cut short by a timeout still leaves these
        with _journal_lock, open(JOURNAL, "a") as f:
            f.write(json.dumps(record) + "\n")
    print(f"[{label}] {record['wall_s']:.0f} s, job_error={record.get('job_error', '')[:300]!r}, runs={summary}",
          flush=True)
    return record


def spec(model, dtype, patch, steps, checks=True, runs=RUNS, seed=0):
    return {
        "model": model,
        "dtype": dtype,
        "patch": patch,
        "backend": "auto",
        "steps": steps,
        "seed": seed,
        "checks": checks,
        "runs": runs
    }


def stage_b(ds_root):
    return [
        job("B bert bf16 cuda-shared 0.19.8 patched", spec("bert", "bf16", True, 20), "cuda-shared", "0.19.8", ds_root,
            300)
    ]


def stage_c1(ds_root):
    return [
        job("C1 bert bf16 nccl 0.19.5 unpatched", spec("bert", "bf16", False, 5, runs=RUNS[1:]), "cuda", "0.19.5",
            ds_root, 240),
        job("C1 bert bf16 nccl 0.19.5 patched", spec("bert", "bf16", True, 20), "cuda", "0.19.5", ds_root, 240),
    ]


def stage_c2(ds_root):
    configs = [(model, dtype) for model in ("bert", "gpt2") for dtype in ("bf16", "fp32")]
    with concurrent.futures.ThreadPoolExecutor(len(configs)) as pool:
        futures = [
            pool.submit(job, f"C2 {model} {dtype} nccl 0.19.8 patched", spec(model, dtype, True, 50), "cuda", "0.19.8",
                        ds_root, 400) for model, dtype in configs
        ]
        return [f.result() for f in futures]


def stage_c3(ds_root):
    records = []
    for version, patch in (("0.19.8", True), ("0.19.8", False), ("0.19.5", True)):
        label = f"C3 gpt2 bf16 nccl {version} {'patched' if patch else 'unpatched'}"
        records.append(job(label, spec("gpt2", "bf16", patch, 30, checks=False), "cuda", version, ds_root, 240))
    return records


STAGES = {"B": stage_b, "C1": stage_c1, "C2": stage_c2, "C3": stage_c3}
# Rough seconds each stage needs; a stage is skipped (and recorded as such) when the deadline leaves less.
NEEDS = {"B": 60, "C1": 90, "C2": 120, "C3": 150}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stages", default="B+C1,C2,C3")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--ds-root", required=True)
    parser.add_argument("--deadline", type=float, default=None, help="epoch seconds after which no stage starts")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    global JOURNAL
    JOURNAL = args.out / "jobs.jsonl"
    for group in args.stages.split(","):  # "B+C1" runs B and C1 side by side (neither is timed)
        names = group.split("+")
        left = None if args.deadline is None else args.deadline - time.time()
        if left is not None and left < max(NEEDS[name] for name in names):
            for name in names:
                print(f"[{name}] skipped: {left:.0f} s left before the deadline", flush=True)
                (args.out / f"stage_{name}.json").write_text(json.dumps({"skipped": f"{left:.0f} s left"}))
            continue
        print(f"[{group}] starting", flush=True)
        with concurrent.futures.ThreadPoolExecutor(len(names)) as pool:
            futures = {name: pool.submit(STAGES[name], args.ds_root) for name in names}
        for name, future in futures.items():
            (args.out / f"stage_{name}.json").write_text(json.dumps(future.result(), indent=1))


if __name__ == "__main__":
    main()
