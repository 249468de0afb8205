"""Backend registry: which implementation serves a tensor on a given device.

``auto`` uses the native CUDA kernels for CUDA tensors (falling back to pure torch with one warning if they
cannot be built) and pure torch elsewhere; ``torch``, ``cuda`` and ``deepspeed`` force one implementation.
"""
import importlib
import warnings

BACKENDS = ("auto", "torch", "cuda", "deepspeed")
_MODULES = {"torch": "torch_ref", "cuda": "cuda", "deepspeed": "deepspeed_op"}
_warned_fallback = False

_resolved = {}  # (name, device type) -> module: the choice never changes once made (load_error is computed once)


def _load(name):
    return importlib.import_module(f"{__name__}.{_MODULES[name]}")


def check_backend_name(name):
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)}")


def resolve_backend(name, device):
    """Return the backend module for ``name`` on ``device`` (a torch.device). On the hot path: one dictionary lookup
    after the first call for a (name, device type)."""
    key = (name, device.type)
    try:
        module = _resolved.get(key)
    except TypeError:  # an unhashable name: the check says what is accepted
        check_backend_name(name)
    if module is None:
        module = _resolved[key] = _resolve(name, device)
    return module


def _resolve(name, device):
    global _warned_fallback
    check_backend_name(name)
    if name != "auto":
        return _load(name)
    if device.type != "cuda":
        return _load("torch")
    cuda = _load("cuda")
    error = cuda.load_error()
    if error is None:
        return cuda
    if not _warned_fallback:
        warnings.warn(f"deepspeed_zeropp: native CUDA quantizer unavailable ({error}); using the pure-torch backend")
        _warned_fallback = True
    return _load("torch")


def serving_name(name, device):
    """The name of the backend that ``resolve_backend(name, device)`` hands out (``auto`` resolved)."""
    module = resolve_backend(name, device).__name__.rsplit(".", 1)[1]
    return next(key for key, value in _MODULES.items() if value == module)
