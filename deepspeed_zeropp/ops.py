"""Public quantize / dequantize: input checks, shape handling and backend dispatch, in one place.

Backends only ever see contiguous tensors whose sizes already agree with the group layout (of any shape: they
return codes or values of their input's shape); everything a caller can get wrong is rejected here with an error
that names the problem and what is accepted. The layout itself comes from :func:`grouping.group_layout`.

This is also the hot path (DeepSpeed calls it per gathered parameter or bucket, a few microseconds of host time
each), so every check runs once per call signature: the first call with a new signature takes the checked path,
which raises on bad input and otherwise remembers the backend entry point and layout arguments under a key of
everything those checks read (tensor types, dtypes, devices, sizes, the arguments and their types). A later call
with an equal key passed the same checks, so it only tests contiguity, which the key leaves out, and calls the
remembered entry point. Arguments that cannot form a key take the checked path every time.

A backend may keep such a table natively as well (``remember_<op>`` and ``native_entry_points``: the CUDA
extension, see csrc/binding.cpp). Its entry point then comes first on every call, takes this module's own
arguments, and answers None for anything it has not been told about, which continues here.
"""
import torch

from .formats.dtypes import DEFAULT_DEQUANT_DTYPE, SUPPORTED_DTYPES, check_float_dtype, check_wire_tensors
from .formats import int8
from .formats.grouping import Layout, group_layout
from .backends import resolve_backend

CALLS_LIMIT = 4096  # signatures per op; a model uses far fewer. A full table is emptied: a hit stays one lookup
_quantize_calls = {}  # key -> (entry point, its arguments after the tensor)
_dequantize_calls = {}  # key -> (entry point, its arguments after codes and scales)
_packed_calls = {}  # key -> (backend module, int8.Packet): quantize_packed's checked signatures


def _not_native(*arguments):
    return None


_native_quantize = _not_native  # a backend's native entry point (see above), once one has been told a signature
_native_dequantize = _not_native
_native_backends = []  # backends told signatures, for forget_signatures


def forget_signatures():
    """Forget every remembered call signature, here and in the backends' native tables."""
    _quantize_calls.clear()
    _dequantize_calls.clear()
    _packed_calls.clear()
    for impl in _native_backends:
        impl.forget_signatures()


def quantize(x, groups=None, backend="auto"):
    """Quantize ``x`` (fp16, bf16 or fp32, any shape and layout) to int8 codes of x's shape and 1-D fp32 scales.

    The groups are ``group_layout(x.numel())`` when ``groups`` is None or that layout's own count; any other
    ``groups`` must divide ``x.numel()`` and gives equal groups (DeepSpeed's op's meaning of the argument).
    """
    result = _native_quantize(x, groups, backend)
    if result is not None:
        return result
    key = call = None
    try:
        key = (type(x), x.dtype, x.device, x.numel(), groups, type(groups), backend)
        call = _quantize_calls[key]
    except Exception:  # a new signature, or arguments that form no key
        pass
    if call is None:  # outside the handler, so that an error of the checks comes with no lookup failure chained
        return _checked_quantize(x, groups, backend, key)
    function, arguments = call
    return function(x if x.is_contiguous() else x.contiguous(), *arguments)


def _checked_quantize(x, groups, backend, key):
    if not (isinstance(x, torch.Tensor) and x.dtype in SUPPORTED_DTYPES and not x.is_meta):
        _check_tensor(x, "quantize input")
        check_float_dtype(x.dtype, "quantize input")
    layout = group_layout(x.numel()) if groups is None else _explicit_layout(x.numel(), groups)
    impl = resolve_backend(backend, x.device)
    call = _entry_point(impl, "quantize", layout)
    result = _remember(_quantize_calls, key, call, x if x.is_contiguous() else x.contiguous())
    if key is not None and hasattr(impl, "remember_quantize"):
        impl.remember_quantize(x, groups, backend, layout.groups, layout.group_size, CALLS_LIMIT)
        _use_native(impl)
    return result


def _explicit_layout(numel, groups):
    if not _is_int(groups):
        raise ValueError(f"groups must be None or a positive int dividing numel={numel}, got {groups!r}")
    layout = group_layout(numel)
    if groups != layout.groups:
        if groups < 1 or numel % groups != 0:
            raise ValueError(f"groups must be None or a positive int dividing numel={numel}, got {groups!r}")
        layout = Layout(groups, numel // groups)
    return layout


def _entry_point(impl, operation, arguments):
    """What a remembered call signature calls: ``(function, arguments)`` with ``function(tensors..., *arguments)``
    equal to ``impl.<operation>(tensors..., *arguments)``. A backend may offer ``bind_<operation>`` to hand out its
    compiled entry point and that entry point's own arguments, so that no Python frame of its own runs per call."""
    bind = getattr(impl, f"bind_{operation}", None)
    return bind(*arguments) if bind is not None else (getattr(impl, operation), arguments)


def _remember(calls, key, call, *tensors):
    """Run ``call`` on ``tensors``; if it succeeds, remember it under ``key`` (None: no key could be built)."""
    function, arguments = call
    result = function(*tensors, *arguments)
    if key is not None:
        if len(calls) >= CALLS_LIMIT:
            calls.clear()
        try:
            calls[key] = call
        except TypeError:  # an unhashable argument the checks accepted: it takes the checked path every time
            pass
    return result


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _check_tensor(value, what):
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{what} must be a torch.Tensor, got {type(value).__name__}")
    if value.is_meta:
        raise ValueError(f"{what} is on the meta device, which holds no values; pass a tensor on a real device")


def _check_dequantize_inputs(codes, scales, dtype):
    """Raise the error that names what is wrong with dequantize's arguments."""
    _check_tensor(codes, "dequantize codes")
    _check_tensor(scales, "dequantize scales")
    if scales.device != codes.device:
        raise ValueError(f"dequantize scales are on {scales.device} but the codes on {codes.device}; "
                         "pass both on the same device")
    check_wire_tensors(codes, scales)
    if dtype is not None:
        check_float_dtype(dtype, "dequantize output")


def dequantize(codes, scales, dtype=None, group_size=None, block_numel=None, backend="auto"):
    """Dequantize int8 ``codes`` with fp32 ``scales`` ([S] or [S, 1]) to ``dtype`` (fp16 when None), codes' shape.

    The groups, by the argument given:
    - ``block_numel=n``: the codes are k buffers of n elements back to back (or a prefix of them), each quantized
      on its own in ``group_layout(n)``'s G groups, with S = k * G scales: an all-gather of per-rank quantized
      partitions.
    - ``group_size=E``: contiguous groups of E elements; the codes may be a prefix of S * E.
    - neither: one quantized buffer, in ``group_layout(codes.numel())`` if that has S groups, else S equal groups.
    """
    result = _native_dequantize(codes, scales, dtype, group_size, block_numel, backend)
    if result is not None:
        return result
    key = call = None
    try:
        key = (type(codes), type(scales), codes.dtype, scales.dtype, codes.device, scales.device, codes.numel(),
               scales.shape, dtype, group_size, type(group_size), block_numel, type(block_numel), backend)
        call = _dequantize_calls[key]
    except Exception:  # see quantize
        pass
    if call is None:
        return _checked_dequantize(codes, scales, dtype, group_size, block_numel, backend, key)
    function, arguments = call
    return function(codes if codes.is_contiguous() else codes.contiguous(),
                    scales if scales.is_contiguous() else scales.contiguous(), *arguments)


def _checked_dequantize(codes, scales, dtype, group_size, block_numel, backend, key):
    _check_dequantize_inputs(codes, scales, dtype)
    out_dtype = DEFAULT_DEQUANT_DTYPE if dtype is None else dtype
    numel = codes.numel()
    size, block = _dequantize_layout(numel, scales.numel(), group_size, block_numel)
    if numel == 0:  # no backend call, nothing to remember
        return torch.empty(codes.shape, dtype=out_dtype, device=codes.device)
    impl = resolve_backend(backend, codes.device)
    call = _entry_point(impl, "dequantize", (size, out_dtype, block))
    result = _remember(_dequantize_calls, key, call, codes if codes.is_contiguous() else codes.contiguous(),
                       scales if scales.is_contiguous() else scales.contiguous())
    if key is not None and hasattr(impl, "remember_dequantize"):
        impl.remember_dequantize(codes, scales, dtype, group_size, block_numel, backend, size, block, CALLS_LIMIT)
        _use_native(impl)
    return result


def _use_native(impl):
    """Put ``impl``'s native entry points first on the hot path (one backend's at a time: only the CUDA extension
    has them, and it serves CUDA tensors only)."""
    global _native_quantize, _native_dequantize
    _native_quantize, _native_dequantize = impl.native_entry_points()
    if impl not in _native_backends:
        _native_backends.append(impl)


def _dequantize_layout(numel, num_groups, group_size, block_numel):
    """(group size, block numel) for the backends; the block numel is None when every group has the group size (the
    backends' fast path): one block, or blocks that split into equal groups."""
    if group_size is not None and block_numel is not None:
        raise ValueError("pass group_size or block_numel, not both")
    if block_numel is not None:
        if not _is_int(block_numel) or block_numel < 1:
            raise ValueError(f"block_numel must be a positive int, got {block_numel!r}")
        layout = group_layout(block_numel)
        blocks = num_groups // layout.groups
        if num_groups % layout.groups != 0 or numel > blocks * block_numel:
            raise ValueError(f"{numel} codes with {num_groups} scales are not blocks of {block_numel} elements "
                             f"in {layout.groups} groups each")
        uniform = blocks == 1 or layout.covers_exactly(block_numel)
        return layout.group_size, None if uniform else block_numel
    if group_size is None:
        layout = group_layout(numel)
        if layout.groups == num_groups:
            return layout.group_size, None
        if numel % num_groups != 0:
            raise ValueError(f"{numel} codes cannot be split into {num_groups} equal groups; pass group_size "
                             "or block_numel")
        return numel // num_groups, None
    if not _is_int(group_size) or group_size < 1:
        raise ValueError(f"group_size must be a positive int, got {group_size!r}")
    if numel > num_groups * group_size:
        raise ValueError(f"{numel} codes do not fit {num_groups} groups of {group_size}")
    return group_size, None


def dequantize_segments(codes, scales, block_numels, dtype=None, backend="auto"):
    """Dequantize buffers that were quantized one by one and concatenated: ``block_numels`` lists their element
    counts in buffer order, each buffer in its own ``group_layout``. DeepSpeed's coalesced MixZ++ gather
    concatenates stored partitions so."""
    _check_dequantize_inputs(codes, scales, dtype)
    dtype = DEFAULT_DEQUANT_DTYPE if dtype is None else dtype
    flat_codes, flat_scales = codes.contiguous().view(-1), scales.reshape(-1)
    if not isinstance(block_numels, (tuple, list)) or not all(_count(n) for n in block_numels):
        raise ValueError(f"block_numels must be a list of non-negative ints, got {block_numels!r}")
    runs = _runs(block_numels)
    if sum(r[0] for r in runs) != flat_codes.numel() or sum(r[1] for r in runs) != flat_scales.numel():
        raise ValueError(
            f"segments {block_numels} do not cover {flat_codes.numel()} codes and {flat_scales.numel()} scales")
    impl = resolve_backend(backend, codes.device)
    out = torch.empty(flat_codes.numel(), dtype=dtype, device=codes.device)
    code_at = scale_at = 0
    for numel, groups, group_size, block_numel in runs:
        if numel:
            out[code_at:code_at + numel] = impl.dequantize(flat_codes[code_at:code_at + numel],
                                                           flat_scales[scale_at:scale_at + groups].contiguous(),
                                                           group_size, dtype,
                                                           None if block_numel == numel else block_numel)
        code_at, scale_at = code_at + numel, scale_at + groups
    return out.view(codes.shape)


def _count(n):
    return _is_int(n) and n >= 0


def _runs(block_numels):
    """One backend call per run of neighbouring buffers: (numel, groups, group size, block numel or None). Buffers of
    one size share a call, and so do buffers of equal groups of one size."""
    runs = []
    for numel in block_numels:
        layout = group_layout(numel)
        kind = (layout.group_size, None if layout.covers_exactly(numel) else numel)
        if runs and runs[-1][2:] == kind:
            runs[-1] = (runs[-1][0] + numel, runs[-1][1] + layout.groups) + kind
        else:
            runs.append((numel, layout.groups) + kind)
    return runs


# --- Packets: a rank's codes and scales in one byte buffer (formats/int8.py), sent in one all-gather ------------

_PACKET = "zeropp_packet"  # attribute of the codes and scales in a packet: their PacketInfo


class PacketInfo:
    """What the codes and scales of a packet carry, one object for both: the byte ``buffer``, its ``layout`` (an
    ``int8.Packet``) and ``sent``, kept for whoever sends the packet (None until then). Only the codes and scales
    reference it, never the buffer, so a collective that holds the buffer makes no reference cycle with it."""
    __slots__ = ("buffer", "layout", "sent")

    def __init__(self, buffer, layout):
        self.buffer, self.layout, self.sent = buffer, layout, None


def quantize_packed(x, groups=None, backend="auto"):
    """``quantize``, with the codes and scales written into one new byte buffer laid out as ``int8.packet``:
    returns (codes, scales) as ``quantize`` does, both views of that buffer, in which :func:`packet_of` finds it.
    Same values as ``quantize``."""
    key = call = None
    try:
        key = (type(x), x.dtype, x.device, x.numel(), groups, type(groups), backend)
        call = _packed_calls[key]
    except Exception:  # see quantize
        pass
    if call is None:
        call = _checked_packed(x, groups, backend, key)
    impl, layout = call
    buffer = torch.empty(layout.nbytes, dtype=torch.uint8, device=x.device)
    codes = buffer[:layout.numel].view(torch.int8)
    scales = buffer[layout.scales_at:layout.scales_at + int8.SCALE_BYTES * layout.groups].view(torch.float32)
    into = getattr(impl, "quantize_into", None)
    if into is not None:
        into(x if x.is_contiguous() else x.contiguous(), layout.groups, layout.group_size, codes, scales)
    else:  # copies of the backend's own results
        own_codes, own_scales = quantize(x, groups, backend)
        codes.copy_(own_codes.reshape(-1))
        scales.copy_(own_scales.reshape(-1))
    codes = codes.view(x.shape)
    # on the tensors handed out (views of another dtype keep no link to their buffer); the closures pass them on
    info = PacketInfo(buffer, layout)
    setattr(codes, _PACKET, info)
    setattr(scales, _PACKET, info)
    return codes, scales


def _checked_packed(x, groups, backend, key):
    if not (isinstance(x, torch.Tensor) and x.dtype in SUPPORTED_DTYPES and not x.is_meta):
        _check_tensor(x, "quantize input")
        check_float_dtype(x.dtype, "quantize input")
    layout = group_layout(x.numel()) if groups is None else _explicit_layout(x.numel(), groups)
    call = (resolve_backend(backend, x.device), int8.packet(x.numel(), layout.groups, layout.group_size))
    if key is not None:
        if len(_packed_calls) >= CALLS_LIMIT:
            _packed_calls.clear()
        try:
            _packed_calls[key] = call
        except TypeError:
            pass
    return call


def _packet_views(rows, layout):
    """(codes [k, numel] int8, scales [k, groups] fp32): views of ``rows``, k packets of ``layout`` as uint8 rows."""
    codes = rows.narrow(1, 0, layout.numel).view(torch.int8)
    scales = rows.narrow(1, layout.scales_at, int8.SCALE_BYTES * layout.groups).view(torch.float32)
    return codes, scales


def packet_of(tensor):
    """The :class:`PacketInfo` of the codes or scales tensor that :func:`quantize_packed` returned, else None. (A
    tensor that copied another's attributes names a buffer it does not start at or in: callers compare data
    pointers.)"""
    return getattr(tensor, _PACKET, None)


def dequantize_packed(received, layout, shape, dtype=None, backend="auto"):
    """Values of an all-gather of packets: ``received`` holds k packets of ``layout`` back to back (uint8, one per
    rank, in rank order). Each rank's codes are dequantized with its own scales, read in place where the backend
    can (``dequantize_ranks``); the result is the first prod(``shape``) values of the k blocks, as a tensor of
    ``shape`` and ``dtype`` (fp16 when None)."""
    _check_tensor(received, "received packets")
    if received.dtype != torch.uint8 or received.dim() != 1 or not received.is_contiguous():
        raise ValueError(f"received packets must be a contiguous 1-D uint8 tensor, got {received.dtype} "
                         f"of shape {tuple(received.shape)}")
    if not isinstance(layout, int8.Packet):
        raise TypeError(f"layout must be a formats.int8.Packet, got {type(layout).__name__}")
    if dtype is not None:
        check_float_dtype(dtype, "dequantize output")
    dtype = DEFAULT_DEQUANT_DTYPE if dtype is None else dtype
    ranks = received.numel() // layout.nbytes
    count = 1
    for size in shape:
        count *= size
    if received.numel() % layout.nbytes != 0 or count > ranks * layout.numel:
        raise ValueError(f"{received.numel()} received bytes are not packets of {layout.nbytes} bytes holding "
                         f"{count} values")
    if count == 0:
        return torch.empty(shape, dtype=dtype, device=received.device)
    codes, scales = _packet_views(received.view(ranks, layout.nbytes), layout)
    in_place = getattr(resolve_backend(backend, received.device), "dequantize_ranks", None)
    if in_place is not None:
        values = in_place(codes, scales, layout.group_size, dtype).view(-1)
        return (values if count == values.numel() else values[:count]).view(shape)
    if layout.groups == group_layout(layout.numel).groups:
        grouping = {"block_numel": layout.numel}
    else:  # explicit equal groups
        grouping = {"group_size": layout.group_size}
    return dequantize(codes.contiguous().view(-1)[:count],
                      scales.contiguous().view(-1),
                      dtype,
                      backend=backend,
                      **grouping).view(shape)
