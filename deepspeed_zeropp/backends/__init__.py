"""Backend registry: which implementation serves a tensor on a given device, and the default the patch sets.

Every backend module implements :class:`~deepspeed_zeropp.backends.base.Backend`. ``auto`` uses the native CUDA
kernels for CUDA tensors (falling back to pure torch with one warning if they cannot be built) and pure torch
elsewhere; ``torch``, ``cuda`` and ``deepspeed`` force one implementation.

The default backend (what the patched quantizer and qgZ use) is set by ``patch(backend=...)`` through
:func:`set_default` and read through :func:`default`; nothing else holds it.

qgZ rule: a backend whose ``SERVES_QGZ`` is False (``deepspeed``: DeepSpeed's op quantizes weights only, in fp16)
leaves qgZ to ``auto``, our dtype-keeping codec. :func:`qgz_backend_name` states the rule, the patch report and
``doctor`` show its result, and the first qgZ call under such a backend warns once.
"""
import importlib
import warnings

BACKENDS = ("auto", "torch", "cuda", "deepspeed")
QGZ_FALLBACK = "auto"
# Backends of one family quantize weights to the same wire values: "native" (formats/, in torch or in the CUDA
# kernels) or "deepspeed-op" (DeepSpeed's fp16 op behind casts). Every rank of a job must use one (agreement.py).
FAMILIES = {"auto": "native", "torch": "native", "cuda": "native", "deepspeed": "deepspeed-op"}
_MODULES = {"torch": "torch_ref", "cuda": "cuda", "deepspeed": "deepspeed_op"}
_loaded = {}  # name -> module, imported once
_resolved = {}  # (name, device type) -> module: the choice never changes once made (load_error is computed once)
_default = "auto"
_warned_fallback = False
_warned_qgz = set()


def _load(name):
    module = _loaded.get(name)
    if module is None:
        module = _loaded[name] = importlib.import_module(f"{__name__}.{_MODULES[name]}")
    return module


def check_backend_name(name):
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)}")


def set_default(name):
    """Make ``name`` the backend the patched quantizer and qgZ use (``patch`` and ``unpatch`` call this)."""
    global _default
    check_backend_name(name)
    _default = name


def default():
    """The backend set by :func:`set_default` ("auto" until then)."""
    return _default


def family(name):
    """The family of backend ``name`` (:data:`FAMILIES`)."""
    check_backend_name(name)
    return FAMILIES[name]


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


def qgz_backend_name(name):
    """The backend that serves qgZ when ``name`` is chosen: ``name`` itself if it serves qgZ, else
    :data:`QGZ_FALLBACK`."""
    check_backend_name(name)
    return name if name == "auto" or _load(name).SERVES_QGZ else QGZ_FALLBACK


def qgz_backend(name, device):
    """The backend module serving qgZ on ``device`` for the chosen backend ``name`` (see :func:`qgz_backend_name`),
    warning once per backend that hands qgZ over."""
    served = qgz_backend_name(name)
    if served != name and name not in _warned_qgz:
        _warned_qgz.add(name)
        warnings.warn(f"deepspeed_zeropp: backend {name!r} does not implement qgZ (zero_quantized_gradients); "
                      f"qgZ uses backend {served!r}")
    return resolve_backend(served, device)


def serving_name(name, device):
    """The name of the backend that ``resolve_backend(name, device)`` hands out (``auto`` resolved)."""
    return resolve_backend(name, device).NAME
