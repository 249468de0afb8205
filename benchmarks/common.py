"""What every benchmark shares: the commit measured, the environment a result names, the interleaved timing of
functions in one process, and ratios taken pair by pair with their min-max.

Importing this module imports neither torch nor DeepSpeed: the helpers that need them import them when called, so a
benchmark's rendering step runs where neither is installed. The configurations a benchmark shares with
``python -m deepspeed_zeropp simulate`` come from the package (``deepspeed_zeropp.simulate.runner.CONFIGS``), never
from here: the package does not import from benchmarks/.
"""
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def commit(override=None):
    """The commit measured: ``override`` (a benchmark's --commit) or $BENCH_COMMIT when set (a copy of the tree on
    another machine may carry stale git metadata), else the checkout's, marked "+dirty" when tracked files differ
    from it, or "unknown" outside git."""
    if override:
        return override
    if os.environ.get("BENCH_COMMIT"):
        return os.environ["BENCH_COMMIT"]

    def git(*args):
        return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True).stdout

    try:
        head = git("rev-parse", "--short", "HEAD").strip()
    except OSError:
        return "unknown"
    if not head:
        return "unknown"
    return head + ("+dirty" if git("status", "--porcelain", "--untracked-files=no").strip() else "")


def gpus():
    """One "name, driver" line per GPU from nvidia-smi (no CUDA context in this process), [] where none answers."""
    query = ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"]
    try:
        return subprocess.run(query, capture_output=True, text=True, check=True).stdout.strip().splitlines()
    except (OSError, subprocess.CalledProcessError):
        return []


def environment(deepspeed=None, device="cuda", commit_id=None):
    """What a result names: Python, torch and DeepSpeed versions and the commit; on CUDA also CUDA's and NCCL's
    versions, the GPUs (``gpus``: nvidia-smi's lines), the first GPU's name (``gpu``: torch's, when CUDA is
    initialised in this process) and the driver. Creates no CUDA context."""
    import torch
    env = dict(python=platform.python_version(), torch=torch.__version__, deepspeed=deepspeed)
    env["commit"] = commit(commit_id)
    if device != "cpu":
        lines = gpus()
        first = [part.strip() for part in lines[0].split(",")] if lines else ["unknown", "unknown"]
        env.update(gpus=lines or "unknown", cuda=torch.version.cuda, driver=first[-1])
        env["gpu"] = torch.cuda.get_device_name() if torch.cuda.is_initialized() else first[0]
        try:
            env["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        except (AttributeError, RuntimeError):
            env["nccl"] = None
    return env


def interleaved(functions, reps, trials):
    """{name: [seconds per call in each trial]} of ``functions`` ({name: (fn, inputs)}), timed with CUDA events:
    every trial times each function once, ``reps`` calls cycling through its inputs, starting one function later
    than the trial before (A B C, B C A, ...), so that a ratio compares figures taken side by side and no function
    always follows the same one."""
    import torch
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = {name: [] for name in functions}
    order = list(functions.items())
    for trial in range(trials):
        shift = trial % len(order)
        for name, (fn, inputs) in order[shift:] + order[:shift]:
            start.record()
            for i in range(reps):
                fn(inputs[i % len(inputs)])
            end.record()
            end.synchronize()
            samples[name].append(start.elapsed_time(end) / 1e3 / reps)
    return samples


def time_per_call(fn, inputs, reps, trials=7, warmup=20):
    """Median over trials of the mean seconds per call, cycling through ``inputs``."""
    for i in range(warmup):
        fn(inputs[i % len(inputs)])
    return statistics.median(interleaved({"fn": (fn, inputs)}, reps, trials)["fn"])


def paired_ratio(values, references):
    """reference / value, pair by pair (the two taken side by side: in one trial, or one repetition of one job),
    pairs with a missing side left out: the median ("ratio"), the min-max over the pairs ("low", "high"), their
    number ("n") and whether the whole spread lies on one side of 1 ("beyond_noise"); None without a pair. With
    times, a ratio above 1 is a speed-up of ``values`` over ``references``; with bandwidths, pass them the other way
    round."""
    paired = [r / v for v, r in zip(values, references) if v is not None and r is not None]
    if not paired:
        return None
    low, high = min(paired), max(paired)
    beyond_noise = low > 1 or high < 1
    return dict(ratio=statistics.median(paired), low=low, high=high, n=len(paired), beyond_noise=beyond_noise)


def per_world_size(script, world_sizes, arguments, env=None):
    """{world size: what ``script --one N *arguments`` prints as JSON on its last line}, each world size in a process
    of its own (a process holds one simulated world); exits naming the world size whose process failed."""
    results = {}
    for world_size in world_sizes:
        child = subprocess.run(
            [sys.executable, str(script), "--one", str(world_size), *arguments],
            capture_output=True,
            text=True,
            env=env)
        if child.returncode != 0:
            sys.exit(f"{Path(script).stem}: {world_size} ranks failed:\n{child.stderr[-4000:]}")
        results[world_size] = json.loads(child.stdout.strip().splitlines()[-1])
    return results
