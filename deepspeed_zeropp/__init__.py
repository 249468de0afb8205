"""deepspeed_zeropp: ZeRO-3 quantized weights (ZeRO++ qwZ / MixZ++) that keep every parameter's dtype.

Importing this package is lean: it does not import DeepSpeed, initialise CUDA, or build anything. Call
:func:`patch` (or set ``DEEPSPEED_ZEROPP=1``) before DeepSpeed starts gathering parameters.
"""
from ._version import __version__

__all__ = ["patch", "unpatch", "register_in_order_backend", "__version__"]


def patch(backend="auto", strict=True):
    """Patch the installed DeepSpeed; see :func:`deepspeed_zeropp.patching.apply.patch`."""
    from .patching.apply import patch as _patch
    return _patch(backend=backend, strict=strict)


def unpatch():
    """Restore DeepSpeed exactly as it was before :func:`patch`."""
    from .patching.apply import unpatch as _unpatch
    _unpatch()


def register_in_order_backend(name):
    """Declare that the torch.distributed backend ``name`` completes each group's collectives in launch order, as
    NCCL does: a quantized job's Init gathers of a list of parameters then stay one call instead of one per
    parameter. Only for backends that keep that order (gloo does not)."""
    from .patching.seams.gathers import register_in_order_backend as _register
    _register(name)
