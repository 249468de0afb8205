"""Native CUDA backend: JIT-builds the csrc/ quantizers on first use and serves CUDA tensors with them.

The build (torch.utils.cpp_extension + ninja) is cached on disk per torch/CUDA version and target
architecture, so only the first process on a machine pays for it; later ones load the cached library.
Nothing happens at import: no CUDA context, no build. A build or load failure is caught once and reported
by :func:`load_error` as a short string, which the backend registry turns into a warning and a fallback.
"""
import contextlib
import os
import re
from pathlib import Path

import torch

from ..formats.dtypes import SUPPORTED_DTYPES, dtype_names
from ..formats.int4 import GROUP, block_bytes

NAME = "cuda"
SERVES_QGZ = True
EXTENSION_NAME = "deepspeed_zeropp_quantizer"
SOURCES = ("binding.cpp", "quantize.cu", "dequantize.cu", "qgz.cu")
CACHE_ENV = "DEEPSPEED_ZEROPP_CACHE"
# The kernels use no architecture-specific ("a"/"f") features, so suffixed entries are built as the plain arch.
_ARCH_PATTERN = re.compile(r"^(\d+)\.(\d+)[af]?(\+PTX)?$", re.IGNORECASE)

_module = None
_error = None
_tried = False


def source_dir():
    """Directory holding the CUDA sources: top-level csrc/ in a source checkout, ``_csrc`` inside an install."""
    package = Path(__file__).resolve().parents[1]
    for candidate in (package.parent / "csrc", package / "_csrc"):
        if all((candidate / name).is_file() for name in SOURCES):
            return candidate
    raise FileNotFoundError(f"CUDA sources {', '.join(SOURCES)} not found beside the package ({package})")


def sanitize_arch_list(arch_list):
    """Normalise a TORCH_CUDA_ARCH_LIST value ("9.0a;10.0a+PTX" -> "9.0;10.0+PTX"); unparsable entries are dropped."""
    kept = []
    for entry in re.split(r"[;\s,]+", arch_list.strip()):
        match = _ARCH_PATTERN.match(entry)
        if match:
            arch = f"{int(match.group(1))}.{int(match.group(2))}" + ("+PTX" if match.group(3) else "")
            if arch not in kept:
                kept.append(arch)
    return ";".join(kept)


def target_arch_list():
    """The sanitised TORCH_CUDA_ARCH_LIST if it names any valid arch, else the current device's capability."""
    arch_list = sanitize_arch_list(os.environ.get("TORCH_CUDA_ARCH_LIST", ""))
    if arch_list:
        return arch_list
    major, minor = torch.cuda.get_device_capability()
    return f"{major}.{minor}"


def build_dir(arch_list):
    """Cache directory for one (torch, CUDA, arch list) combination, shared by every process of the user."""
    root = Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "deepspeed_zeropp")
    arch_tag = arch_list.replace(";", "_").replace(".", "").replace("+", "")
    torch_tag = torch.__version__.split("+")[0]
    path = root / f"torch{torch_tag}_cu{torch.version.cuda}_sm{arch_tag}"
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextlib.contextmanager
def _environ(name, value):
    """Set an environment variable for the build only: torch reads the arch list from os.environ."""
    previous = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if previous is None:
            del os.environ[name]
        else:
            os.environ[name] = previous


def _build():
    from torch.utils.cpp_extension import load

    sources = source_dir()
    arch_list = target_arch_list()
    with _environ("TORCH_CUDA_ARCH_LIST", arch_list):
        return load(
            name=EXTENSION_NAME,
            sources=[str(sources / name) for name in SOURCES],
            extra_include_paths=[str(sources)],
            # No --use_fast_math: IEEE division and no flush-to-zero are part of the wire format.
            extra_cflags=["-O3"],
            extra_cuda_cflags=["-O3"],
            build_directory=str(build_dir(arch_list)),
            verbose=False)


def _short(exc):
    lines = str(exc).strip().splitlines()
    first = lines[0] if lines else ""
    return f"{type(exc).__name__}: {first[:200]}" if first else type(exc).__name__


def load_error():
    """None when the native extension is usable (building it on the first call), else a short cause. Never raises."""
    global _module, _error, _tried
    if not _tried:
        _tried = True
        if torch.version.cuda is None:
            _error = "torch was built without CUDA"
        elif not torch.cuda.is_available():
            _error = "no CUDA device is available"
        else:
            try:
                _module = _build()
            except Exception as exc:  # any build/load failure becomes a fallback, not a crash
                _error = f"building the CUDA extension failed ({_short(exc)})"
    return _error


def _extension():
    error = load_error()
    if error is not None:
        raise RuntimeError(f"deepspeed_zeropp CUDA backend unavailable: {error}")
    return _module


def quantize(x, groups, group_size=None):
    """Quantize a contiguous CUDA tensor, read flat, in ``groups`` groups of ``group_size`` elements (default: equal
    groups), the last one possibly short -> (int8 codes of x's shape, fp32 scales [groups])."""
    function, arguments = bind_quantize(groups, x.numel() // groups if group_size is None else group_size)
    return function(x, *arguments)


def bind_quantize(groups, group_size):
    """The extension's entry point and its arguments after the tensor, for ``quantize(x, groups, group_size)``:
    ops remembers them per call signature, so its hot path calls the extension with no frame of this module."""
    return (_module or _extension()).quantize, (groups, group_size)


# Output format ids of the extension's dequantize (binding.cpp's format_id).
_FORMAT_IDS = {torch.float16: 0, torch.bfloat16: 1, torch.float32: 2}


def dequantize(codes, scales, layout, dtype):
    """Dequantize contiguous int8 ``codes`` (read flat) with contiguous fp32 ``scales`` ([S] or [S, 1]) into a new
    tensor of ``dtype`` and the codes' shape, in ``layout`` (a ``grouping.GatheredLayout``)."""
    function, arguments = bind_dequantize(layout, dtype)
    return function(codes, scales, *arguments)


def bind_dequantize(layout, dtype):
    """The extension's entry point and its arguments after codes and scales, for ``dequantize(codes, scales,
    layout, dtype)``: the layout's ``kernel_arguments`` and the format id; see :func:`bind_quantize`."""
    return (_module or _extension()).dequantize, layout.kernel_arguments + (_FORMAT_IDS[dtype], )


def quantize_into(x, groups, group_size, codes, scales):
    """``quantize`` writing into ``codes`` (int8, x's numel) and ``scales`` (fp32 [groups]): the views of a packet
    (ops.quantize_packed), so that a packet costs one kernel and no copy."""
    (_module or _extension()).quantize_into(x, groups, group_size, codes, scales)


MAX_SEGMENTS = 32  # inputs per quantize_many_into call: csrc/quantizer.h's kMaxSegments (the extension checks it)


def quantize_many_into(xs, groups, group_sizes, codes, scales):
    """``quantize_into`` for each of ``xs`` (contiguous, of one device and dtype, at most ``MAX_SEGMENTS``) into
    ``codes[i]`` and ``scales[i]``: one kernel where every input and its codes start on 16-byte boundaries (two
    otherwise), the same values as one call each."""
    (_module or _extension()).quantize_many_into(xs, groups, group_sizes, codes, scales)


ROWS_LIMIT = 65535  # rows one dequantize_rows call reads (its grid's second dimension)


def dequantize_ranks(codes, scales, layout, dtype):
    """Per-rank rows read in place from a gathered buffer of packets, one kernel: ``codes`` [k, n] and ``scales``
    [k, G] strided views (ops.dequantize_packed), each row one block of ``layout`` (the packets' ``gathered``: the
    kernel reads its group size) -> a new [k, n] tensor of ``dtype``."""
    if codes.shape[0] > ROWS_LIMIT:
        return torch.cat([
            dequantize_ranks(part, scale, layout, dtype)
            for part, scale in zip(codes.split(ROWS_LIMIT), scales.split(ROWS_LIMIT))
        ])
    return (_module or _extension()).dequantize_rows(codes, scales, layout.group_size, _FORMAT_IDS[dtype])


# Whether ops.dequantize_packed_parts calls dequantize_parts_into (every parameter's part straight into its buffer,
# one kernel for the bucket) instead of one dequantize of the whole bucket and a copy per part.
# benchmarks/results/packets_h100.md measures the two.
WRITES_PARTS = True


def dequantize_parts_into(codes, scales, layout, first_columns, outs):
    """Parts of per-rank rows read in place (``codes`` [k, n] and ``scales`` [k, G], the rows' whole codes and
    scales: views of a gathered buffer of packets), part i being columns ``first_columns[i]`` on, written into
    ``outs[i]`` (contiguous [k, m_i], its dtype the output's); each row one block of ``layout`` (the packets'
    ``gathered``). One kernel for all the parts (one per output dtype where they differ) per ``ROWS_LIMIT`` rows."""
    extension = _module or _extension()
    rows = codes.shape[0]
    if rows <= ROWS_LIMIT:
        extension.dequantize_parts_into(codes, scales, layout.group_size, first_columns, outs)
        return
    for at in range(0, rows, ROWS_LIMIT):
        count = min(ROWS_LIMIT, rows - at)
        extension.dequantize_parts_into(codes.narrow(0, at, count), scales.narrow(0, at, count), layout.group_size,
                                        first_columns, [out.narrow(0, at, count) for out in outs])


def _check_qgz(condition, message):
    """Every qgZ argument is checked here first, so that a wrong one raises ValueError naming it; csrc/binding.cpp
    checks the same conditions again before it launches (TORCH_CHECK: RuntimeError) for callers of the extension
    that bypass this module."""
    if not condition:
        raise ValueError(f"deepspeed_zeropp qgZ kernels: {message}")


def _check_blocks(blocks, rows, padded_chunk):
    _check_qgz(
        blocks.is_cuda and blocks.dtype == torch.uint8 and blocks.dim() == 2 and blocks.is_contiguous(),
        f"blocks must be a contiguous 2-D uint8 CUDA tensor [sources, bytes], got {blocks.dtype} "
        f"{tuple(blocks.shape)} on {blocks.device}")
    _check_qgz(1 <= blocks.shape[0] < 2**31, f"blocks need 1 to 2^31 - 1 sources, got {blocks.shape[0]}")
    _check_qgz(
        blocks.shape[1] == block_bytes(rows, padded_chunk),
        f"blocks hold {blocks.shape[1]} bytes per source, expected {block_bytes(rows, padded_chunk)} "
        f"({rows} rows of {padded_chunk})")
    _check_qgz(blocks.data_ptr() % 4 == 0, "blocks must be 4-byte aligned")


def _check_geometry(rows, padded_chunk):
    _check_qgz(1 <= rows < 2**31, f"rows must be in [1, 2^31), got {rows}")
    _check_qgz(padded_chunk >= 0 and padded_chunk % GROUP == 0,
               f"padded_chunk must be a non-negative multiple of {GROUP}, got {padded_chunk}")


def _check_feedback(feedback, values, device):
    """An error buffer the LoCo kernels may read and write: fp32, flat, contiguous, one value per encoded value."""
    error = feedback.error
    _check_qgz(
        error.is_cuda and error.device == device and error.dtype == torch.float32 and error.dim() == 1
        and error.is_contiguous(), f"the error buffer must be a flat contiguous float32 tensor on {device}, got "
        f"{error.dtype} {tuple(error.shape)} on {error.device}")
    _check_qgz(error.numel() == values, f"the error buffer holds {error.numel()} values, expected {values}")
    _check_qgz(error.data_ptr() % 16 == 0, "the error buffer must be 16-byte aligned")


def qgz_encode(flat, destinations, rows, chunk, padded_chunk, feedback=None):
    """qgZ: a flat CUDA gradient -> uint8 blocks [destinations, block bytes] (layout: ``formats/int4.py``); with
    an ``int4.Feedback``, LoCo's error feedback (its error updated in place)."""
    _check_qgz(flat.is_cuda and flat.dim() == 1 and flat.is_contiguous(),
               "the gradient must be a flat contiguous CUDA tensor")
    _check_qgz(flat.dtype in SUPPORTED_DTYPES, f"the gradient must be one of {dtype_names()}, got {flat.dtype}")
    _check_geometry(rows, padded_chunk)
    _check_qgz(
        1 <= destinations < 2**31 and 0 <= chunk <= padded_chunk,
        f"need 1 <= destinations < 2^31, 0 <= chunk <= padded_chunk, got {destinations}, {chunk}, {padded_chunk}")
    _check_qgz(destinations * rows * (padded_chunk // GROUP) < 2**31, f"at most 2^31 - 1 groups of {GROUP} per call")
    _check_qgz(destinations * rows * chunk >= flat.numel(),
               f"{destinations} x {rows} chunks of {chunk} do not cover the input's {flat.numel()} values")
    if feedback is None:
        return _extension().qgz_encode(flat, destinations, rows, chunk, padded_chunk)
    _check_feedback(feedback, destinations * rows * padded_chunk, flat.device)
    return _extension().qgz_encode_feedback(flat, feedback.error, feedback.beta, feedback.keep, destinations, rows,
                                            chunk, padded_chunk)


def qgz_reduce_encode(blocks, rows, padded_chunk, feedback=None):
    """qgZ: received blocks [sources, bytes] of ``rows`` rows -> fp32 sum over sources -> [rows, bytes of one row];
    with an ``int4.Feedback``, LoCo's error feedback on the sums (its error updated in place)."""
    _check_geometry(rows, padded_chunk)
    _check_blocks(blocks, rows, padded_chunk)
    _check_qgz(rows * (padded_chunk // GROUP) < 2**31, f"at most 2^31 - 1 groups of {GROUP} per call")
    if feedback is None:
        return _extension().qgz_reduce_encode(blocks, rows, padded_chunk)
    _check_feedback(feedback, rows * padded_chunk, blocks.device)
    return _extension().qgz_reduce_encode_feedback(blocks, feedback.error, feedback.beta, feedback.keep, rows,
                                                   padded_chunk)


def qgz_decode_sum(blocks, padded_chunk, count, factor, dtype):
    """qgZ: received one-row blocks -> the first ``count`` values of (fp32 sum over sources) * factor, in ``dtype``."""
    _check_geometry(1, padded_chunk)
    _check_blocks(blocks, 1, padded_chunk)
    _check_qgz(dtype in SUPPORTED_DTYPES, f"the output dtype must be one of {dtype_names()}, got {dtype}")
    _check_qgz(0 <= count <= padded_chunk, f"count must be in [0, padded_chunk], got {count}")
    # flat, contiguous, on the blocks' device, at most padded_chunk values of a checked dtype: all the kernel needs
    out = torch.empty(count, dtype=dtype, device=blocks.device)
    _extension().qgz_decode_sum(blocks, padded_chunk, factor, out)
    return out
