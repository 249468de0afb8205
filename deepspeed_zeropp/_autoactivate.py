"""``DEEPSPEED_ZEROPP=1``: patch DeepSpeed in scripts that never import this package (HF Trainer, launchers).

The installed ``deepspeed_zeropp.pth`` imports this module at interpreter start only when the variable is set,
so it must import nothing heavy: it only registers an import hook, and patches DeepSpeed right after DeepSpeed
itself has been imported (before any model is partitioned). A patch that cannot be applied makes every
``import deepspeed`` fail with the cause: the user asked for the patch, and running unpatched would hide that.
"""
import importlib.abc
import os
import sys

from ._env import ENV, backend as requested_backend, requested, unrecognised_message


class _PatchAfterDeepSpeedImport(importlib.abc.MetaPathFinder):
    """Stays in ``sys.meta_path`` until a patch succeeds, so a failed one fails every later import too."""

    def find_spec(self, fullname, path, target=None):
        if fullname != "deepspeed":
            return None
        sys.meta_path.remove(self)  # find the real spec with the other finders, once
        try:
            import importlib.util
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _PatchingLoader(spec.loader)
        return spec


class _PatchingLoader(importlib.abc.Loader):

    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        _patch_now()
        sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _PatchAfterDeepSpeedImport)]


def _patch_now():
    import deepspeed_zeropp
    backend = requested_backend()
    try:
        report = deepspeed_zeropp.patch(backend=backend)
    except Exception as error:
        raise RuntimeError(f"[deepspeed_zeropp] {ENV}={os.environ.get(ENV)} asks for the patch, but it cannot be "
                           f"applied: {type(error).__name__}: {error}. Fix that, or unset {ENV} to run DeepSpeed "
                           f"unpatched.") from error
    if int(os.environ.get("RANK", "0")) == 0:
        print(
            f"[deepspeed_zeropp] active via {ENV}=1: {len(report.patched)} sites patched on DeepSpeed "
            f"{report.deepspeed_version} (backend {backend})",
            file=sys.stderr)


def activate_from_environment():
    wanted = requested()
    if wanted is None:
        print(f"[deepspeed_zeropp] warning: {unrecognised_message()}", file=sys.stderr)
    if not wanted:
        return
    if "deepspeed" in sys.modules:
        _patch_now()
    elif not any(isinstance(f, _PatchAfterDeepSpeedImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchAfterDeepSpeedImport())


activate_from_environment()
