"""Start a harness job: ``harness.worker`` on every rank (``deepspeed_zeropp.demo.launch`` starts the processes),
with the instrument modules the spec names importable there as they are here."""
import importlib.util
import os

from deepspeed_zeropp.demo.launch import DEVICES, JobFailed, run_ranks  # noqa: F401  (JobFailed: for callers)
from deepspeed_zeropp.demo.launch import extensions_claimed, extensions_dir, free_port  # noqa: F401  (for tests)
from deepspeed_zeropp.demo.launch import release_shared_memory  # noqa: F401  (for tests)

# The folder above harness/: the ranks start ``python -m harness.worker`` from it whatever the working directory
# (the repository root, the compatibility run's, a GPU host's).
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def instrument_names(names):
    """``spec["instruments"]`` as a list of module names."""
    if names is None:
        return []
    if isinstance(names, str):
        return [names]
    if isinstance(names, (list, tuple)) and all(isinstance(name, str) for name in names):
        return list(names)
    raise ValueError(f"spec['instruments'] is {names!r}; expected a module name or a list of module names")


def instrument_root(name):
    """The sys.path entry this process imports instrument module ``name`` from, for the ranks to import it the same
    way: the directory above its top-level package."""
    try:
        found = importlib.util.find_spec(name)
    except ModuleNotFoundError:  # a missing parent package
        found = None
    if found is None or found.origin is None:
        raise ValueError(f"spec['instruments']: no module {name!r} importable here (a dotted module name is expected)")
    levels = name.count(".") + (os.path.basename(found.origin) == "__init__.py")
    root = os.path.dirname(os.path.abspath(found.origin))
    for _ in range(levels):
        root = os.path.dirname(root)
    return root


def run_job(spec, world_size=2, timeout=600, env=None, device="cpu", local_size=None):
    """Run ``spec`` (see worker.py) on ``world_size`` local ranks; return rank 0's results dict.

    ``device`` and ``local_size``: as for :func:`deepspeed_zeropp.demo.launch.run_ranks` (one of ``DEVICES``).
    Raises JobFailed with the ranks' output tails if a rank crashes, hangs past ``timeout`` seconds, or rank 0
    writes no result. ``spec["instruments"]``: modules importable here whose hooks the ranks run (worker.py)."""
    if device not in DEVICES:
        raise ValueError(f"unknown device {device!r}; choose one of {', '.join(DEVICES)}")
    roots = [instrument_root(name) for name in instrument_names(spec.get("instruments"))]
    return run_ranks("harness.worker", spec, world_size, timeout, env, device, local_size, roots + [ROOT])
