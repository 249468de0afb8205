"""Public quantize / dequantize: input checks, shape handling and backend dispatch, in one place.

Backends only ever see contiguous tensors whose sizes already agree with the group layout (of any shape: they
return codes or values of their input's shape); everything a caller can get wrong is rejected here with an error
that names the problem and what is accepted. The layout itself comes from :func:`grouping.group_layout`; what a
backend dequantizes in is a ``grouping.GatheredLayout``, computed here once per call signature (or handed in by a
gather seam, or carried by a packet) and passed to the backend unchanged.

This is also the hot path (DeepSpeed calls it per gathered parameter or bucket, a few microseconds of host time
each), so every check runs once per call signature: the first call with a new signature takes the checked path,
which raises on bad input and otherwise remembers the backend entry point and layout arguments under a key of
everything those checks read (tensor types, dtypes, devices, sizes, the arguments and their types). A later call
with an equal key passed the same checks, so it only tests contiguity, which the key leaves out, and calls the
remembered entry point. Arguments that cannot form a key take the checked path every time.
"""
import itertools

import torch

from .formats.dtypes import DEFAULT_DEQUANT_DTYPE, SUPPORTED_DTYPES, check_float_dtype, check_wire_tensors
from .formats import int8
from .formats.grouping import GatheredLayout, Layout, blocks_of, equal_groups, group_layout
from .backends import resolve_backend

CALLS_LIMIT = 4096  # signatures per op; a model uses far fewer. A full table is emptied: a hit stays one lookup
_quantize_calls = {}  # key -> (entry point, its arguments after the tensor)
_dequantize_calls = {}  # key -> (entry point, its arguments after codes and scales)
_packed_calls = {}  # key -> (backend module, int8.Packet): quantize_packed's checked signatures
_FLOAT_DTYPES = frozenset(SUPPORTED_DTYPES)


def forget_signatures():
    """Forget every remembered call signature."""
    _quantize_calls.clear()
    _dequantize_calls.clear()
    _packed_calls.clear()


def quantize(x, groups=None, backend="auto"):
    """Quantize ``x`` (fp16, bf16 or fp32, any shape and layout) to int8 codes of x's shape and 1-D fp32 scales.

    The groups are ``group_layout(x.numel())`` when ``groups`` is None or that layout's own count; any other
    ``groups`` must divide ``x.numel()`` and gives equal groups (DeepSpeed's op's meaning of the argument).
    """
    key, call = _recall(_quantize_calls, _quantize_key, x, groups, backend)
    if call is None:
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
    return _remember(_quantize_calls, key, call, x if x.is_contiguous() else x.contiguous())


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


def _recall(calls, key_of, *arguments):
    """``(key, remembered call or None)`` for ``key_of(*arguments)`` in the table ``calls``; ``(None, None)`` for
    arguments that form no key (the key reads an attribute they lack, or holds an unhashable value). The checked
    path then runs outside this handler, so its errors come with no lookup failure chained."""
    try:
        key = key_of(*arguments)
        return key, calls.get(key)
    except Exception:
        return None, None


def _keep(calls, key, call):
    """Remember ``call`` under ``key`` (None: no key could be built); a full table is emptied first."""
    if key is not None:
        if len(calls) >= CALLS_LIMIT:
            calls.clear()
        calls[key] = call


def _remember(calls, key, call, *tensors):
    """Run ``call`` on ``tensors``; if it succeeds, remember it under ``key``."""
    function, arguments = call
    result = function(*tensors, *arguments)
    _keep(calls, key, call)
    return result


# The keys: everything the checked paths read, except contiguity, which the fast paths test themselves.
_GATHERED = "gathered"  # first part of dequantize_gathered's keys in _dequantize_calls (dequantize's never are)


def _quantize_key(x, groups, backend):
    return (type(x), x.dtype, x.device, x.numel(), groups, type(groups), backend)


def _dequantize_key(codes, scales, dtype, group_size, block_numel, backend):
    return (type(codes), type(scales), codes.dtype, scales.dtype, codes.device, scales.device, codes.numel(),
            scales.shape, dtype, group_size, type(group_size), block_numel, type(block_numel), backend)


def _gathered_key(codes, scales, layout, dtype, backend):
    return (_GATHERED, type(codes), type(scales), codes.dtype, scales.dtype, codes.device, scales.device,
            codes.numel(), scales.shape, dtype, type(layout), layout, backend)


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
    key, call = _recall(_dequantize_calls, _dequantize_key, codes, scales, dtype, group_size, block_numel, backend)
    if call is None:
        return _checked_dequantize(codes, scales, dtype, group_size, block_numel, backend, key)
    function, arguments = call
    return function(codes if codes.is_contiguous() else codes.contiguous(),
                    scales if scales.is_contiguous() else scales.contiguous(), *arguments)


def _checked_dequantize(codes, scales, dtype, group_size, block_numel, backend, key):
    _check_dequantize_inputs(codes, scales, dtype)
    layout = _dequantize_layout(codes.numel(), scales.numel(), group_size, block_numel)
    return _dequantize_in(codes, scales, layout, dtype, backend, key)


def _dequantize_in(codes, scales, layout, dtype, backend, key):
    """The checked path's backend call, in ``layout`` (a ``GatheredLayout``, passed on unchanged), remembered
    under ``key``."""
    out_dtype = DEFAULT_DEQUANT_DTYPE if dtype is None else dtype
    if codes.numel() == 0:  # no backend call, nothing to remember
        return torch.empty(codes.shape, dtype=out_dtype, device=codes.device)
    impl = resolve_backend(backend, codes.device)
    call = _entry_point(impl, "dequantize", (layout, out_dtype))
    return _remember(_dequantize_calls, key, call, codes if codes.is_contiguous() else codes.contiguous(),
                     scales if scales.is_contiguous() else scales.contiguous())


def _dequantize_layout(numel, num_groups, group_size, block_numel):
    """The ``GatheredLayout`` for the backends of dequantize's layout arguments; equal groups throughout (the
    backends' fast path) for one buffer, one block, or blocks that split into equal groups."""
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
        return blocks_of(block_numel).for_scales(num_groups)
    if group_size is None:
        layout = group_layout(numel)
        if layout.groups == num_groups:
            return equal_groups(layout.group_size)
        if numel % num_groups != 0:
            raise ValueError(f"{numel} codes cannot be split into {num_groups} equal groups; pass group_size "
                             "or block_numel")
        return equal_groups(numel // num_groups)
    if not _is_int(group_size) or group_size < 1:
        raise ValueError(f"group_size must be a positive int, got {group_size!r}")
    if numel > num_groups * group_size:
        raise ValueError(f"{numel} codes do not fit {num_groups} groups of {group_size}")
    return equal_groups(group_size)


def dequantize_gathered(codes, scales, layout, dtype=None, backend="auto"):
    """``dequantize`` in a ``grouping.GatheredLayout`` the caller already holds (a gather seam's
    ``scope.DequantTarget.layout``, a packet's ``gathered``): checked against the codes and scales once per call
    signature and passed to the backend unchanged (a single block read as equal groups, ``for_scales``)."""
    key, call = _recall(_dequantize_calls, _gathered_key, codes, scales, layout, dtype, backend)
    if call is None:
        return _checked_gathered(codes, scales, layout, dtype, backend, key)
    function, arguments = call
    return function(codes if codes.is_contiguous() else codes.contiguous(),
                    scales if scales.is_contiguous() else scales.contiguous(), *arguments)


def _checked_gathered(codes, scales, layout, dtype, backend, key):
    _check_dequantize_inputs(codes, scales, dtype)
    if not (isinstance(layout, GatheredLayout) and _is_int(layout.group_size) and layout.group_size >= 1 and
            (layout.block_numel is None or _is_int(layout.block_numel) and layout.block_numel >= 1)):
        raise TypeError(f"layout must be a formats.grouping.GatheredLayout of positive ints, got {layout!r}")
    if not layout.fits(codes.numel(), scales.numel()):
        raise ValueError(f"{codes.numel()} codes with {scales.numel()} scales do not fit {layout}")
    return _dequantize_in(codes, scales, layout.for_scales(scales.numel()), dtype, backend, key)


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
    for numel, groups, layout in runs:
        if numel:
            out[code_at:code_at + numel] = impl.dequantize(flat_codes[code_at:code_at + numel],
                                                           flat_scales[scale_at:scale_at + groups].contiguous(),
                                                           layout, dtype)
        code_at, scale_at = code_at + numel, scale_at + groups
    return out.view(codes.shape)


def _count(n):
    return _is_int(n) and n >= 0


def _runs(block_numels):
    """One backend call per run of neighbouring buffers: (numel, groups, its ``GatheredLayout``). Buffers of one size
    share a call, and so do buffers of equal groups of one size."""
    runs = []
    for numel in block_numels:
        groups, layout = group_layout(numel).groups, blocks_of(numel)
        if runs and runs[-1][2] == layout:
            runs[-1] = (runs[-1][0] + numel, runs[-1][1] + groups, layout)
        else:
            runs.append((numel, groups, layout))
    return [(numel, groups, layout.for_scales(groups)) for numel, groups, layout in runs]


# --- Packets: a rank's codes and scales in one byte buffer (formats/int8.py), sent in one all-gather ------------

_PACKET = "zeropp_packet"  # attribute of the codes and scales in a packet: their PacketInfo


class PacketInfo:
    """What the codes and scales of a packet carry, one object for both: the byte ``buffer`` and its ``layout`` (an
    ``int8.Packet``). Only the codes and scales reference it, never the buffer, so a collective that holds the
    buffer makes no reference cycle with it."""
    __slots__ = ("buffer", "layout")

    def __init__(self, buffer, layout):
        self.buffer, self.layout = buffer, layout


def quantize_packed(x, groups=None, backend="auto"):
    """``quantize``, with the codes and scales written into one new byte buffer laid out as ``int8.packet``:
    returns (codes, scales) as ``quantize`` does, both views of that buffer, in which :func:`packet_of` finds it.
    Same values as ``quantize``."""
    key, call = _recall(_packed_calls, _quantize_key, x, groups, backend)
    if call is None:
        call = _checked_packed(x, groups, backend, key)
    impl, layout = call
    buffer, codes, scales = _new_packet(layout, x.device)
    into = getattr(impl, "quantize_into", None)
    if into is not None:
        into(x if x.is_contiguous() else x.contiguous(), layout.groups, layout.group_size, codes, scales)
    else:  # copies of the backend's own results
        own_codes, own_scales = quantize(x, groups, backend)
        codes.copy_(own_codes.reshape(-1))
        scales.copy_(own_scales.reshape(-1))
    return _handed_out(buffer, layout, codes, scales, x.shape)


def quantize_packed_many(xs, backend="auto"):
    """``[quantize_packed(x, backend=backend) for x in xs]``, the same packets, with fewer backend calls: a backend
    with ``quantize_many_into`` quantizes the inputs of one device and dtype together, ``MAX_SEGMENTS`` of them per
    call where the backend has that limit (one kernel a call on the CUDA backend); other inputs go one by one."""
    results = [None] * len(xs)
    batches = {}
    for i, x in enumerate(xs):
        key, call = _recall(_packed_calls, _quantize_key, x, None, backend)
        if call is None:
            call = _checked_packed(x, None, backend, key)
        impl = call[0]
        if getattr(impl, "quantize_many_into", None) is None or not x.is_contiguous():
            results[i] = quantize_packed(x, None, backend)
        else:
            batches.setdefault((impl, x.device, x.dtype), []).append((i, call[1]))
    for (impl, device, _), members in batches.items():
        limit = getattr(impl, "MAX_SEGMENTS", None) or len(members)
        for at in range(0, len(members), limit):
            chunk = members[at:at + limit]
            packets = [_new_packet(layout, device) for _, layout in chunk]
            impl.quantize_many_into([xs[i] for i, _ in chunk], [layout.groups for _, layout in chunk],
                                    [layout.group_size for _, layout in chunk], [codes for _, codes, _ in packets],
                                    [scales for _, _, scales in packets])
            for (i, layout), (buffer, codes, scales) in zip(chunk, packets):
                results[i] = _handed_out(buffer, layout, codes, scales, xs[i].shape)
    return results


def _new_packet(layout, device):
    """A new packet's byte buffer for ``layout`` (an ``int8.Packet``) and its flat codes and scales views."""
    buffer = torch.empty(layout.nbytes, dtype=torch.uint8, device=device)
    codes = buffer[:layout.numel].view(torch.int8)
    scales = buffer[layout.scales_at:layout.scales_at + int8.SCALE_BYTES * layout.groups].view(torch.float32)
    return buffer, codes, scales


def _handed_out(buffer, layout, codes, scales, shape):
    """(codes in ``shape``, scales) as quantize_packed returns them, each carrying the packet's PacketInfo."""
    codes = codes.view(shape)
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
    _keep(_packed_calls, key, call)
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


def _received_ranks(received, layout):
    """How many packets of ``layout`` (an ``int8.Packet``) ``received`` holds, or the error naming what is wrong."""
    _check_tensor(received, "received packets")
    if received.dtype != torch.uint8 or received.dim() != 1 or not received.is_contiguous():
        raise ValueError(f"received packets must be a contiguous 1-D uint8 tensor, got {received.dtype} "
                         f"of shape {tuple(received.shape)}")
    if not isinstance(layout, int8.Packet):
        raise TypeError(f"layout must be a formats.int8.Packet, got {type(layout).__name__}")
    return received.numel() // layout.nbytes


def dequantize_packed(received, layout, shape, dtype=None, backend="auto"):
    """Values of an all-gather of packets: ``received`` holds k packets of ``layout`` back to back (uint8, one per
    rank, in rank order). Each rank's codes are dequantized with its own scales, read in place where the backend
    can (``dequantize_ranks``); the result is the first prod(``shape``) values of the k blocks, as a tensor of
    ``shape`` and ``dtype`` (fp16 when None)."""
    ranks = _received_ranks(received, layout)
    if dtype is not None:
        check_float_dtype(dtype, "dequantize output")
    dtype = DEFAULT_DEQUANT_DTYPE if dtype is None else dtype
    count = 1
    for size in shape:
        count *= size
    if received.numel() % layout.nbytes != 0 or count > ranks * layout.numel:
        raise ValueError(f"{received.numel()} received bytes are not packets of {layout.nbytes} bytes holding "
                         f"{count} values")
    if count == 0:
        return torch.empty(shape, dtype=dtype, device=received.device)
    return _dequantize_rows(received, layout, ranks, count, dtype, backend).view(shape)


def _dequantize_rows(received, layout, ranks, count, dtype, backend):
    """The first ``count`` values of the ``ranks`` packets' blocks, flat: :func:`dequantize_packed` once checked."""
    codes, scales = _packet_views(received.view(ranks, layout.nbytes), layout)
    in_place = getattr(resolve_backend(backend, received.device), "dequantize_ranks", None)
    if in_place is not None:
        values = in_place(codes, scales, layout.gathered, dtype).view(-1)
        return values if count == values.numel() else values[:count]
    return dequantize_gathered(codes.contiguous().view(-1)[:count],
                               scales.contiguous().view(-1),
                               layout.gathered,
                               dtype,
                               backend=backend)


def dequantize_packed_parts(received, layout, parts, dtypes, backend="auto"):
    """Every rank's values of consecutive parts of the packets ``received`` (as :func:`dequantize_packed`): part i
    is the next ``parts[i]`` values of each rank's block; returns, for each part, a new flat tensor of ``dtypes[i]``
    holding that part of every rank in rank order (``ranks * parts[i]`` values), each its own allocation. A bucket's
    wait hands each parameter one such tensor.

    Where the backend writes parts in place (``WRITES_PARTS``, ``dequantize_parts_into``) one call writes every
    part straight into its tensor; otherwise one dequantize of every rank's block (in the common dtype, fp32 when
    mixed) and one copy per part. The values are the same: each is code times scale in fp32, rounded once to its
    dtype."""
    ranks = _received_ranks(received, layout)
    if len(parts) != len(dtypes):
        raise ValueError(f"{len(parts)} parts but {len(dtypes)} dtypes; pass one dtype per part")
    if not _FLOAT_DTYPES.issuperset(dtypes):
        for dtype in dtypes:
            check_float_dtype(dtype, "dequantize output")
    if min(parts, default=0) < 0 or sum(parts) > layout.numel:
        raise ValueError(f"parts {list(parts)} are not counts that fit packets of {layout.numel} values")
    if received.numel() != ranks * layout.nbytes:
        raise ValueError(f"{received.numel()} received bytes are not packets of {layout.nbytes} bytes")
    device = received.device
    impl = resolve_backend(backend, device)
    if getattr(impl, "WRITES_PARTS", False):
        codes, scales = _packet_views(received.view(ranks, layout.nbytes), layout)
        outs = [torch.empty(ranks * part, dtype=dtype, device=device) for part, dtype in zip(parts, dtypes)]
        firsts = list(itertools.accumulate(parts, initial=0))[:-1]
        impl.dequantize_parts_into(codes, scales, layout.gathered, firsts,
                                   [out.view(ranks, part) for out, part in zip(outs, parts)])
        return outs
    if ranks == 0:
        return [torch.empty(0, dtype=dtype, device=device) for dtype in dtypes]
    common = dtypes[0] if len(set(dtypes)) == 1 else torch.float32
    values = _dequantize_rows(received, layout, ranks, ranks * layout.numel, common, backend).view(ranks, -1)
    outs, at = [], 0
    for part, dtype in zip(parts, dtypes):
        out = torch.empty(ranks * part, dtype=dtype, device=device)
        out.view(ranks, part).copy_(values.narrow(1, at, part))
        outs.append(out)
        at += part
    return outs
