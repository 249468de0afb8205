"""``doctor``: what is installed, whether that DeepSpeed needs the patch, and proof that the patch works here.

Every line it prints comes from a check it ran: versions read from the packages, the site table from an actual
``patch(strict=False)`` (undone afterwards), and a quantize/dequantize round trip per device and dtype."""
import importlib.metadata
import os
import platform
import sys

from packaging.version import Version

PROBLEM, WARN, OK = "PROBLEM", "warning", "ok"


def _version(package):
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _round_trip(device, backend):
    import torch
    from . import ops
    lines = []
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        if device == "cpu" and dtype == torch.float16:
            continue  # DeepSpeed refuses fp16 on its CPU accelerator; nothing to prove here
        x = torch.randn(4099, device=device).to(dtype) * 1e3
        codes, scales = ops.quantize(x, backend=backend)
        out = ops.dequantize(codes, scales, dtype=dtype, backend=backend)
        error = ((out.float() - x.float()).abs().max() / x.float().abs().max()).item()
        good = out.dtype == dtype and error <= 1 / 128 + 1e-2
        lines.append((OK if good else PROBLEM, f"round trip {device} {str(dtype)[6:]}: {out.dtype}, "
                      f"max error {error:.4f} of absmax"))
    return lines


def checks(backend="auto"):
    """Yield (level, message) pairs."""
    import torch
    yield OK, f"Python {platform.python_version()}, torch {torch.__version__}"
    cuda = torch.cuda.is_available()
    yield OK, (f"CUDA {torch.version.cuda}: {torch.cuda.get_device_name()}" if cuda else "CUDA: not available")
    ds = _version("deepspeed")
    if ds is None:
        yield PROBLEM, "DeepSpeed is not installed: pip install deepspeed (0.16 or newer)"
        return
    release = Version(Version(ds).base_version)
    if release < Version("0.19.6"):
        yield WARN, (f"DeepSpeed {ds} has the dtype bug: bf16/fp32 with zero_quantized_weights crashes "
                     "('expected scalar type Half but found BFloat16', #7775) or corrupts weights")
    else:
        yield WARN, (f"DeepSpeed {ds} casts bf16/fp32 through fp16 to quantize (values above 65504 become NaN, "
                     "tiny ones vanish) and asserts on partitions that are not multiples of 8")
    import deepspeed_zeropp
    from .patching.apply import _originals
    was_patched = bool(_originals)
    report = deepspeed_zeropp.patch(backend=backend, strict=False)
    for site in report.sites:
        level = PROBLEM if site.status.startswith("missing") else OK
        yield level, f"site {site.name}: {site.status}"
    if not was_patched:
        deepspeed_zeropp.unpatch()
    yield from _round_trip("cpu", "torch")
    if cuda:
        from .backends import cuda as cuda_backend
        error = cuda_backend.load_error()
        if error:
            yield WARN, f"native CUDA kernels unavailable ({error}); the pure-torch backend is used on GPU"
        yield from _round_trip("cuda", "auto")
    active = os.environ.get("DEEPSPEED_ZEROPP", "")
    yield OK, (f"DEEPSPEED_ZEROPP={active}: unmodified scripts are patched when they import DeepSpeed"
               if active else "DEEPSPEED_ZEROPP unset: call deepspeed_zeropp.patch() or export DEEPSPEED_ZEROPP=1")


def run(backend="auto"):
    problems = 0
    for level, message in checks(backend):
        problems += level == PROBLEM
        print(f"[{level:>7}] {message}")
    print("doctor: " + ("everything needed is in place" if not problems else f"{problems} problem(s) to fix"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(run())
