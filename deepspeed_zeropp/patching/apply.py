"""Apply and undo the patch on the installed DeepSpeed, and report what was done at each site."""
import importlib
import logging
import warnings
from typing import List, NamedTuple

from packaging.version import Version

from .. import backends
from .installed import replaced as _originals
from .seams.common import MARKER, mark
from .sites import NEWEST_KNOWN, OLDEST_SUPPORTED, SITES

logger = logging.getLogger("deepspeed_zeropp")
_MISSING = object()


class PatchError(RuntimeError):
    """A site the table expects on this DeepSpeed release could not be patched."""


class SiteReport(NamedTuple):
    name: str
    status: str  # "patched", "absent in this release", "missing (not patched)", "excluded"
    detail: str = ""


class PatchReport(NamedTuple):
    deepspeed_version: str
    backend: str
    sites: List[SiteReport]
    qgz_backend: str = "auto"  # the backend serving qgZ for ``backend`` (backends.qgz_backend_name)

    @property
    def patched(self):
        return [s.name for s in self.sites if s.status == "patched"]

    def __str__(self):
        width = max(len(s.name) for s in self.sites)
        qgz = "" if self.qgz_backend == self.backend else f"; qgZ: {self.qgz_backend}"
        lines = [f"deepspeed_zeropp on DeepSpeed {self.deepspeed_version} (backend: {self.backend}{qgz})"]
        lines += [f"  {s.name:<{width}}  {s.status}{'  (' + s.detail + ')' if s.detail else ''}" for s in self.sites]
        return "\n".join(lines)


def _release(version_string):
    return Version(Version(version_string).base_version)


def _in_range(site, version):
    return ((site.since is None or version >= _release(site.since))
            and (site.until is None or version <= _release(site.until)))


def _check_version(version_string, strict):
    version = _release(version_string)
    if version < _release(OLDEST_SUPPORTED):
        message = (f"DeepSpeed {version_string} is older than the oldest release deepspeed_zeropp supports "
                   f"({OLDEST_SUPPORTED}); upgrade DeepSpeed or pass strict=False to try anyway")
        if strict:
            raise PatchError(message)
        warnings.warn(message)
    elif version > _release(NEWEST_KNOWN):
        warnings.warn(f"DeepSpeed {version_string} is newer than the newest release deepspeed_zeropp was tested with "
                      f"({NEWEST_KNOWN}); patching the sites known from {NEWEST_KNOWN}")
    return version


def _detail(site, version):
    if site.upstream_fixed_in and version >= _release(site.upstream_fixed_in):
        return f"upstream casts through fp16 here since {site.upstream_fixed_in}; replaced by native dtypes"
    return ""


def _patch_site(site, version):
    module = importlib.import_module(site.module)
    owner = module if site.owner is None else getattr(module, site.owner, None)
    if owner is not module and not isinstance(owner, type):
        return None
    original = owner.__dict__.get(site.attr, _MISSING)
    if original is _MISSING and not site.adds:
        return None
    if getattr(original, MARKER, False):
        return SiteReport(site.name, "patched", _detail(site, version))
    setattr(owner, site.attr, mark(site.factory(original), None if original is _MISSING else original, site.why))
    _originals[site.name] = (owner, site.attr, original)
    logger.info("deepspeed_zeropp: patched %s.%s", site.module, site.name)
    return SiteReport(site.name, "patched", _detail(site, version))


def patch(backend="auto", strict=True, exclude=()):
    """Patch the installed DeepSpeed so ZeRO-3 quantized weights keep every parameter's dtype.

    ``backend``: "auto" (native CUDA kernels for CUDA tensors, pure torch elsewhere), "torch", "cuda", or
    "deepspeed" (DeepSpeed's own fp16 op with casts around it, upstream 0.19.6+ numerics; it has no qgZ, so
    zero_quantized_gradients runs on "auto", as the report says: ``backends.qgz_backend_name``). Idempotent: a second
    call only switches the backend. With ``strict`` a site expected on this release but not found raises
    :class:`PatchError` naming the site and the DeepSpeed version. All or nothing: if the call raises, every
    object it replaced is restored and the backend is unchanged. ``exclude`` names sites to leave alone (tests
    use it to show what each site fixes). Returns a :class:`PatchReport`."""
    backends.check_backend_name(backend)
    import deepspeed
    version = _check_version(deepspeed.__version__, strict)
    replaced = []  # names of the sites this call replaced, to undo on failure
    try:
        reports = [_site_report(site, version, deepspeed.__version__, exclude, strict, replaced) for site in SITES]
    except BaseException:
        for name in reversed(replaced):
            _restore(name)
        raise
    backends.set_default(backend)
    return PatchReport(deepspeed.__version__, backend, reports, backends.qgz_backend_name(backend))


def _site_report(site, version, version_string, exclude, strict, replaced):
    if site.name in exclude:
        return SiteReport(site.name, "excluded")
    if not _in_range(site, version):
        return SiteReport(site.name, "absent in this release")
    fresh = site.name not in _originals
    report = _patch_site(site, version)
    if fresh and site.name in _originals:
        replaced.append(site.name)
    if report is not None:
        return report
    message = (f"deepspeed_zeropp: expected {site.module}.{site.name} in DeepSpeed {version_string} "
               f"but it is not there; this release is not supported")
    if strict:
        raise PatchError(message)
    warnings.warn(message)
    return SiteReport(site.name, "missing (not patched)")


def _restore(name):
    owner, attr, original = _originals.pop(name)
    if original is _MISSING:
        delattr(owner, attr)
    else:
        setattr(owner, attr, original)


def unpatch():
    """Restore every object the patch replaced, exactly as it was. Safe to call when nothing is patched."""
    for name in reversed(list(_originals)):
        _restore(name)
    backends.set_default("auto")
