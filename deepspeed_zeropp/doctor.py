"""``doctor``: what is installed, whether that DeepSpeed needs the patch, and proof that the patch works here.

Every line it prints comes from a check it ran: versions read from the packages, the site table from an actual
``patch(strict=False)`` (undone afterwards), and a quantize/dequantize round trip per device and dtype."""
import importlib.metadata
import os
import platform
import site
import sys

from packaging.version import Version

PROBLEM, WARN, OK = "PROBLEM", "warning", "ok"
NOTE, SKIPPED = "note", "n/a"  # what the patch is for; a site this release does not have (nothing to patch)


def _version(package):
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _round_trip(device, backend):
    import torch
    from . import ops
    from .backends import serving_name
    from .formats.dtypes import SUPPORTED_DTYPES
    lines = []
    for dtype in SUPPORTED_DTYPES:
        x = torch.randn(4099, device=device).to(dtype) * 1e3
        what = f"round trip {device} {str(dtype)[6:]} (backend {backend}"
        try:
            served = serving_name(backend, x.device)
            codes, scales = ops.quantize(x, backend=backend)
            out = ops.dequantize(codes, scales, dtype=dtype, backend=backend)
        except Exception as error:
            lines.append((PROBLEM, f"{what}): failed: {type(error).__name__}: {error}"))
            continue
        error = ((out.float() - x.float()).abs().max() / x.float().abs().max()).item()
        good = out.dtype == dtype and error <= 1 / 128 + 1e-2
        lines.append((OK if good else PROBLEM, f"{what}, ran {served}): {out.dtype}, max error {error:.4f} of absmax"))
    return lines


def _pth_locations():
    """The site-packages directories this interpreter processes .pth files from."""
    dirs = list(site.getsitepackages()) if hasattr(site, "getsitepackages") else []
    if site.ENABLE_USER_SITE:
        dirs.append(site.getusersitepackages())
    return dirs


def _activation_checks():
    """DEEPSPEED_ZEROPP and DEEPSPEED_ZEROPP_BACKEND as the installed .pth will read them, and the agreement check's
    variables."""
    from . import _env as auto
    from .backends import BACKENDS
    wanted = auto.requested()
    backend = os.environ.get(auto.BACKEND_ENV)
    bad_backend = backend is not None and backend not in BACKENDS
    if bad_backend:
        yield PROBLEM, (f"{auto.BACKEND_ENV}={backend!r} is not a backend; choose one of {', '.join(BACKENDS)} "
                        f"(with {auto.ENV}=1 every `import deepspeed` would fail)")
    try:
        from .agreement import timeout
        timeout()
    except ValueError as error:
        yield PROBLEM, f"{error} (every ZeRO++ job would stop at its first quantized collective)"
    yield from _agreement_switch_check()
    installed = [d for d in _pth_locations() if os.path.isfile(os.path.join(d, "deepspeed_zeropp.pth"))]
    if wanted is None:
        yield PROBLEM, auto.unrecognised_message()
    elif not installed:
        yield (PROBLEM if wanted else WARN), (
            f"deepspeed_zeropp.pth is in none of this interpreter's site-packages ({', '.join(_pth_locations())}): "
            f"{auto.ENV}=1 does nothing here; reinstall with `pip install .` or `pip install -e .`")
    elif wanted and not bad_backend:
        yield OK, (f"{auto.ENV}={os.environ[auto.ENV]}: unmodified scripts are patched when they import DeepSpeed "
                   f"(deepspeed_zeropp.pth in {installed[0]})")
    elif not wanted:
        yield OK, (f"{auto.ENV} off: call deepspeed_zeropp.patch() or export {auto.ENV}=1 "
                   f"(deepspeed_zeropp.pth in {installed[0]})")


def _agreement_switch_check():
    """DEEPSPEED_ZEROPP_AGREEMENT, when set: what the ranks' agreement check (agreement.py) will do."""
    from . import _env as auto
    value = os.environ.get(auto.AGREEMENT_ENV)
    if value is None:
        return
    try:
        wanted = auto.agreement_wanted()
    except ValueError as error:
        yield PROBLEM, f"{error} (every ZeRO++ job would stop at its first quantized collective)"
        return
    if wanted:
        yield OK, (f"{auto.AGREEMENT_ENV}={value}: at its first quantized collective every rank checks that all run "
                   f"the patch alike (the default)")
    else:
        yield WARN, (f"{auto.AGREEMENT_ENV}={value}: the ranks do not check that all run the patch alike; a rank "
                     f"left unpatched then trains on different numerics without a word (or the job hangs or reads "
                     f"garbage) instead of stopping with an AgreementError; unset it unless the launcher is known "
                     f"to patch every rank")


def _launcher_check():
    """Whether DeepSpeed's multi-node launcher, patched as it is now, forwards the patch's variables: a runner built
    by it from an environment holding them (patching/seams/launcher.py) must carry every one."""
    from . import _env as auto
    from .patching.seams import launcher
    environ = dict(auto.ours(), **{auto.ENV: "1"})
    try:
        carried = launcher.probe(environ)
    except Exception as error:
        carried, failure = {}, f" (the probe failed: {type(error).__name__}: {error})"
    else:
        failure = ""
    if carried == environ:
        return OK, (f"DeepSpeed's multi-node launcher (deepspeed --hostfile: pdsh, openmpi, mvapich, slurm, impi, "
                    f"mpich) forwards {', '.join(sorted(environ))} to every node when it runs with {auto.ENV}=1")
    return WARN, (f"DeepSpeed's multi-node launcher will not forward {', '.join(sorted(set(environ) - set(carried)))} "
                  f"to the other nodes{failure}: their ranks stay unpatched (the job stops at its first quantized "
                  f"collective); put {auto.ENV}=1 in .deepspeed_env, export it on every node, or call "
                  f"deepspeed_zeropp.patch() in the training script")


def checks(backend="auto"):
    """Yield (level, message) pairs."""
    import torch
    from .backends import BACKENDS, qgz_backend_name
    from .patching import sites
    yield OK, f"Python {platform.python_version()}, torch {torch.__version__}"
    cuda = torch.cuda.is_available()
    yield OK, (f"CUDA {torch.version.cuda}: {torch.cuda.get_device_name()}" if cuda else "CUDA: not available")
    ds = _version("deepspeed")
    if ds is None:
        yield PROBLEM, f"DeepSpeed is not installed: pip install 'deepspeed>={sites.OLDEST_SUPPORTED}'"
        return
    release = Version(Version(ds).base_version)
    if release < Version(sites.OLDEST_SUPPORTED):
        yield PROBLEM, (f"DeepSpeed {ds} is older than the oldest release deepspeed_zeropp supports "
                        f"({sites.OLDEST_SUPPORTED}): pip install 'deepspeed>={sites.OLDEST_SUPPORTED}'")
    elif release > Version(sites.NEWEST_KNOWN):
        yield WARN, f"DeepSpeed {ds} is newer than the newest release tested ({sites.NEWEST_KNOWN})"
    if release < Version(sites.UPSTREAM_DTYPE_FIX):
        yield NOTE, (f"DeepSpeed {ds} unpatched has the dtype bug: bf16/fp32 with zero_quantized_weights crashes "
                     "('expected scalar type Half but found BFloat16') or corrupts weights; the patch fixes it")
    else:
        yield NOTE, (f"DeepSpeed {ds} unpatched casts bf16/fp32 through fp16 to quantize (values above 65504 become "
                     "NaN, tiny ones vanish) and asserts on partitions that are not multiples of 8; the patch "
                     "fixes both")
    if backend not in BACKENDS:
        yield PROBLEM, f"--backend {backend!r} is not a backend; choose one of {', '.join(BACKENDS)}"
        return
    import deepspeed_zeropp
    from .patching.installed import is_patched
    was_patched = is_patched()
    try:
        report = deepspeed_zeropp.patch(backend=backend, strict=False)
    except Exception as error:  # with DEEPSPEED_ZEROPP=1 this is also where the import hook fails
        yield PROBLEM, f"patch(backend={backend!r}) failed: {type(error).__name__}: {error}"
        yield from _activation_checks()
        return
    for site_report in report.sites:
        level = (PROBLEM
                 if site_report.status.startswith("missing") else OK if site_report.status == "patched" else SKIPPED)
        yield level, f"site {site_report.name}: {site_report.status}"
    if qgz_backend_name(backend) != backend:
        yield WARN, (f"backend {backend} has no qgZ: zero_quantized_gradients (and LoCo) run on backend "
                     f"{qgz_backend_name(backend)}")
    yield _launcher_check()
    if not was_patched:
        deepspeed_zeropp.unpatch()
    if backend in ("auto", "torch"):
        yield from _round_trip("cpu", backend)
    elif not cuda:
        yield PROBLEM, f"backend {backend} quantizes CUDA tensors only, and this machine has no CUDA GPU"
    if cuda:
        from .backends import cuda as cuda_backend
        error = cuda_backend.load_error()
        if error and backend == "auto":
            yield WARN, f"native CUDA kernels unavailable ({error}); the pure-torch backend is used on GPU"
        yield from _round_trip("cuda", backend)
    yield from _activation_checks()


def run(backend="auto"):
    # Every check first, then the list: what DeepSpeed logs while the checks import and patch it comes before it.
    results = list(checks(backend))
    for level, message in results:
        print(f"[{level:>7}] {message}")
    problems = sum(level == PROBLEM for level, _ in results)
    warned = sum(level == WARN for level, _ in results)
    if problems:
        print(f"doctor: {problems} problem(s) to fix")
    elif warned:
        print(f"doctor: the patch works here; read the {warned} warning(s) above")
    else:
        print("doctor: everything needed is in place")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(run())
