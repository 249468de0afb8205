"""Start a job of several ranks on this machine: one subprocess per rank, each running a worker module on a JSON job
spec, rendezvous over TCP on localhost; rank 0 writes the results the caller gets back."""
import contextlib
import fcntl
import glob
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class JobFailed(RuntimeError):
    """``partial``: rank 0's results of the runs it finished (None if it wrote none)."""
    partial = None


def release_shared_memory(port):
    """DeepSpeed's CPU accelerator keeps its all-reduce buffers in /dev/shm, named after the master address and
    port, and never unlinks them: ~70 MB per rank per job, until the machine runs out of memory."""
    for leftover in glob.glob(f"/dev/shm/deepspeed_*_127.0.0.1_{port}_*"):
        with contextlib.suppress(OSError):
            os.unlink(leftover)


def extensions_dir():
    """DeepSpeed's CPU accelerator JIT-builds a shared-memory op under a fixed name; builds from different
    DeepSpeed releases must not share a cache directory, or one release loads another's incompatible op."""
    from importlib.metadata import version
    return os.path.join(os.path.expanduser("~"), ".cache", "deepspeed_zeropp",
                        f"torch_extensions_ds{version('deepspeed')}")


@contextlib.contextmanager
def extensions_claimed(directory):
    """Hold ``directory`` (a TORCH_EXTENSIONS_DIR of this package) for ranks that may JIT-build into it.

    Torch marks a build in progress with a ``lock`` file in the extension's folder and removes it when the build
    ends; a rank killed mid-build (a job past its timeout) leaves it behind, and every later job then waits on it
    forever. Launchers hold a shared flock on the directory while their ranks run (the kernel drops it when a
    launcher dies), so one that gets the flock exclusively knows no build can be running: it removes such leftovers
    first, saying so."""
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, ".launchers"), "a") as claim:
        try:
            fcntl.flock(claim, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # another launcher's ranks run: its locks are live
            pass
        else:
            for leftover in glob.glob(os.path.join(directory, "*", "lock")):
                print(f"deepspeed_zeropp: removing {leftover}, left by a build that was killed", file=sys.stderr)
                with contextlib.suppress(OSError):
                    os.unlink(leftover)
        fcntl.flock(claim, fcntl.LOCK_SH)
        yield directory


def own_extensions_claimed(env=None):
    """:func:`extensions_claimed` for the folder that processes started with ``env`` (over os.environ) build into,
    when it is this package's (:func:`extensions_dir`); a folder the caller chose is left alone."""
    ours = extensions_dir()
    chosen = dict(os.environ, **(env or {})).get("TORCH_EXTENSIONS_DIR", ours)
    return extensions_claimed(ours) if chosen == ours else contextlib.nullcontext(chosen)


DEVICES = ("cpu", "cuda-shared", "cuda", "cuda-isolated")


def run_ranks(worker, spec, world_size=2, timeout=600, env=None, device="cpu", local_size=None, paths=()):
    """Run ``python -m worker spec.json`` on ``world_size`` local ranks; return the results dict rank 0 wrote to
    ``spec["out"]`` (set here, with ``spec["device"]``).

    ``device``: "cpu" (DeepSpeed's CPU accelerator, gloo), "cuda-shared" (every rank on GPU 0, gloo: several
    ranks on a one-GPU machine, NCCL refuses that; each rank sees one device, so each is its own node and qgZ
    runs), "cuda" (one GPU per rank, NCCL) or "cuda-isolated" (as "cuda", but each rank sees only its own GPU, so
    every rank is its own node: how qgZ runs on one host over NCCL). Raises JobFailed with the ranks' output tails
    if a rank crashes, hangs past ``timeout`` seconds, or rank 0 writes no result.
    ``paths``: sys.path entries the ranks need first (where ``worker`` and what it imports are found).
    ``local_size``: ranks per "node" on CPU (DeepSpeed's CPU accelerator counts devices from LOCAL_SIZE); fewer
    than ``world_size`` makes several nodes, which is when ZeRO++ qgZ runs."""
    if device not in DEVICES:
        raise ValueError(f"unknown device {device!r}; choose one of {', '.join(DEVICES)}")
    workdir = tempfile.mkdtemp(prefix="deepspeed_zeropp_job_")
    try:
        with own_extensions_claimed(env):  # while the ranks run
            return _run_in(workdir, worker, spec, world_size, timeout, env, device, local_size, paths)
    finally:  # the job's files (checkpoints of ~100 MB included) are read or in the exception by now
        shutil.rmtree(workdir, ignore_errors=True)


def _run_in(workdir, worker, spec, world_size, timeout, env, device, local_size, roots):
    spec = dict(spec, out=os.path.join(workdir, "result.json"), device=device)
    spec_path = os.path.join(workdir, "spec.json")
    with open(spec_path, "w") as f:
        json.dump(spec, f)
    base_env = dict(os.environ, **(env or {}))
    port = free_port()
    base_env.update(MASTER_ADDR="127.0.0.1",
                    MASTER_PORT=str(port),
                    WORLD_SIZE=str(world_size),
                    LOCAL_SIZE=str(local_size or world_size),
                    OMP_NUM_THREADS="1",
                    PYTHONUNBUFFERED="1")
    base_env.setdefault("TORCH_EXTENSIONS_DIR", extensions_dir())
    paths = [path for path in base_env.get("PYTHONPATH", "").split(os.pathsep) if path]
    missing = [root for root in dict.fromkeys(roots) if root not in paths]
    if missing:  # first: the ranks import the same modules as this process
        base_env["PYTHONPATH"] = os.pathsep.join(missing + paths)
    if device == "cpu":
        base_env["DS_ACCELERATOR"] = "cpu"
    procs, logs = [], []
    for rank in range(world_size):
        log = open(os.path.join(workdir, f"rank{rank}.log"), "w+")
        rank_env = dict(base_env, RANK=str(rank), LOCAL_RANK=str(rank if device in ("cpu", "cuda") else 0))
        if device == "cuda-isolated":
            rank_env["CUDA_VISIBLE_DEVICES"] = str(rank)
        procs.append(
            subprocess.Popen([sys.executable, "-m", worker, spec_path],
                             env=rank_env,
                             stdout=log,
                             stderr=subprocess.STDOUT))
        logs.append(log)
    deadline = time.monotonic() + timeout
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        time.sleep(0.2)
    hung = [p for p in procs if p.poll() is None]
    for p in hung:
        p.kill()
        p.wait()
    release_shared_memory(port)
    tails = []
    for rank, log in enumerate(logs):
        log.seek(0)
        tails.append(f"--- rank {rank} (exit {procs[rank].returncode}) ---\n" + log.read()[-4000:])
        log.close()
    if hung or any(p.returncode != 0 for p in procs) or not os.path.exists(spec["out"]):
        reason = f"timed out after {timeout}s" if hung else "a rank failed"
        failed = JobFailed(f"job ({worker}) {reason}:\n" + "\n".join(tails))
        if os.path.exists(spec["out"]):
            with open(spec["out"]) as f:
                failed.partial = json.load(f)
        raise failed
    with open(spec["out"]) as f:
        return json.load(f)
