"""``DEEPSPEED_ZEROPP=1``: patch DeepSpeed in scripts that never import this package (HF Trainer, launchers).

The installed ``deepspeed_zeropp.pth`` imports this module at every interpreter start, so it must cost nothing
when the variable is unset and import nothing heavy when it is set: it only registers an import hook, and
patches DeepSpeed right after DeepSpeed itself has been imported (before any model is partitioned).
"""
import importlib.abc
import os
import sys

ENV = "DEEPSPEED_ZEROPP"


class _PatchAfterDeepSpeedImport(importlib.abc.MetaPathFinder):

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
        sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _PatchAfterDeepSpeedImport)]
        _patch_now()


def _patch_now():
    import deepspeed_zeropp
    backend = os.environ.get("DEEPSPEED_ZEROPP_BACKEND", "auto")
    report = deepspeed_zeropp.patch(backend=backend)
    if int(os.environ.get("RANK", "0")) == 0:
        print(
            f"[deepspeed_zeropp] active via {ENV}=1: {len(report.patched)} sites patched on DeepSpeed "
            f"{report.deepspeed_version} (backend {backend})",
            file=sys.stderr)


def activate_from_environment():
    if os.environ.get(ENV, "").strip().lower() not in ("1", "true", "yes", "on"):
        return
    if "deepspeed" in sys.modules:
        _patch_now()
    elif not any(isinstance(f, _PatchAfterDeepSpeedImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchAfterDeepSpeedImport())


activate_from_environment()
