"""Every entry point of the native extension (csrc/binding.cpp) called directly, past the Python wrappers' checks, with
a wrong dtype, device, layout or size: each raises RuntimeError naming what is wrong and what is accepted (its
TORCH_CHECK), the interpreter survives, and the extension still computes afterwards. The messages carry numbers and
sizes on purpose: formatting those through an iostream inside the extension is what crashed the interpreter on the H200
host (csrc/binding.cpp says why), and a number missing from a message is that fault's milder form elsewhere."""
import re

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

from deepspeed_zeropp.backends import cuda as cuda_backend  # noqa: E402
from deepspeed_zeropp.formats.int4 import GROUP, block_bytes  # noqa: E402
from tests.helpers import extension_builds  # noqa: E402,F401

FP16, FP32 = cuda_backend._FORMAT_IDS[torch.float16], cuda_backend._FORMAT_IDS[torch.float32]
PADDED = 2 * GROUP  # padded_chunk of the qgZ cases: one row of 512 values
ROW_BYTES = block_bytes(1, PADDED)
BETA, KEEP = 0.8, 0.2


def zeros(*shape, dtype=torch.float32, device="cuda"):
    return torch.zeros(*shape, dtype=dtype, device=device)


def cpu(*shape):
    return zeros(*shape, device="cpu")


def i8(*shape):
    return zeros(*shape, dtype=torch.int8)


def f16(*shape):
    return zeros(*shape, dtype=torch.float16)


def f64(*shape):
    return zeros(*shape, dtype=torch.float64)


def blocks(sources=2, rows=1, device="cuda"):
    return zeros(sources, block_bytes(rows, PADDED), dtype=torch.uint8, device=device)


def strided(numel):
    """A flat fp32 tensor that is not contiguous (every other value of a buffer)."""
    return zeros(2 * numel)[::2]


def misaligned(numel, offset_bytes):
    """A flat contiguous fp32 tensor whose data starts `offset_bytes` past an allocation's (aligned) start."""
    return zeros(4 * numel + offset_bytes, dtype=torch.uint8)[offset_bytes:].view(torch.float32)


def misaligned_blocks(offset_bytes):
    """One source of blocks whose data starts `offset_bytes` past an allocation's (aligned) start."""
    return zeros(ROW_BYTES + offset_bytes, dtype=torch.uint8)[offset_bytes:].view(1, ROW_BYTES)


def case(name, message, call):
    return pytest.param(call, message, id=name)


NOT_A_FORMAT = "input must be torch.float16, torch.bfloat16 or torch.float32, got "
NOT_A_FORMAT_OUT = NOT_A_FORMAT.replace("input", "out")
NOT_A_FORMAT_ID = "format id must be 0 (torch.float16), 1 (torch.bfloat16) or 2 (torch.float32), got "

# (id, the message's start, a call of the extension); each call's arguments are wrong in exactly one way.
CASES = [
    # quantize(input, groups, group_size)
    case("quantize-cpu", "input must be a CUDA tensor, got one on cpu", lambda m: m.quantize(cpu(8), 1, 8)),
    case("quantize-float64", NOT_A_FORMAT + "torch.float64", lambda m: m.quantize(f64(8), 1, 8)),
    case("quantize-int8", NOT_A_FORMAT + "torch.int8", lambda m: m.quantize(i8(8), 1, 8)),
    case("quantize-strided", "input must be contiguous", lambda m: m.quantize(zeros(4, 4).t(), 1, 16)),
    case("quantize-no-groups", "groups must be in [1, 2^31 - 1], got 0", lambda m: m.quantize(zeros(8), 0, 8)),
    case("quantize-negative-group-size", "group_size must be in [0, 2^31 - 65)",
         lambda m: m.quantize(zeros(8), 1, -1)),
    case("quantize-short", "1 groups of 4 elements do not cover 8 elements", lambda m: m.quantize(zeros(8), 1, 4)),
    case("quantize-empty-last-group", "3 groups of 4 elements do not cover 8", lambda m: m.quantize(zeros(8), 3, 4)),
    # quantize_into(input, groups, group_size, codes, scales)
    case("quantize_into-input-float64", NOT_A_FORMAT + "torch.float64",
         lambda m: m.quantize_into(f64(8), 1, 8, i8(8), zeros(1))),
    case("quantize_into-codes-float32", "codes must be torch.int8, got torch.float32",
         lambda m: m.quantize_into(zeros(8), 1, 8, zeros(8), zeros(1))),
    case("quantize_into-scales-cpu", "scales must be a CUDA tensor, got one on cpu",
         lambda m: m.quantize_into(zeros(8), 1, 8, i8(8), cpu(1))),
    case("quantize_into-codes-size", "codes must hold the input's 8 values, got 7",
         lambda m: m.quantize_into(zeros(8), 1, 8, i8(7), zeros(1))),
    case("quantize_into-scales-size", "scales must hold 1 values (one per group), got 2",
         lambda m: m.quantize_into(zeros(8), 1, 8, i8(8), zeros(2))),
    # dequantize(codes, scales, group_size, block_numel, format_id)
    case("dequantize-codes-float16", "codes must be torch.int8, got torch.float16",
         lambda m: m.dequantize(f16(8), zeros(2), 4, 4, FP32)),
    case("dequantize-scales-float16", "scales must be torch.float32, got torch.float16",
         lambda m: m.dequantize(i8(8), f16(2), 4, 4, FP32)),
    case("dequantize-codes-cpu", "codes must be a CUDA tensor, got one on cpu",
         lambda m: m.dequantize(cpu(8).to(torch.int8), zeros(2), 4, 4, FP32)),
    case("dequantize-scales-strided", "scales must be contiguous",
         lambda m: m.dequantize(i8(8), strided(2), 4, 4, FP32)),
    case("dequantize-format-id", NOT_A_FORMAT_ID + "3", lambda m: m.dequantize(i8(8), zeros(2), 4, 4, 3)),
    case("dequantize-group-size", "group_size and block_numel must be >= 1, got 0 and 4",
         lambda m: m.dequantize(i8(8), zeros(2), 0, 4, FP32)),
    case("dequantize-few-scales", "8 codes do not fit 1 groups of 4",
         lambda m: m.dequantize(i8(8), zeros(1), 4, 4, FP32)),
    case("dequantize-few-blocks", "10 codes with 2 scales do not fit blocks of 6 elements in 2 groups of 4",
         lambda m: m.dequantize(i8(10), zeros(2), 4, 6, FP32)),
    # dequantize_rows(codes [k, n], scales [k, G], group_size, format_id)
    case("dequantize_rows-flat", "codes must be [k, n] and scales [k, G] with as many rows",
         lambda m: m.dequantize_rows(i8(8), zeros(1, 2), 4, FP16)),
    case("dequantize_rows-codes-cpu", "codes must be a CUDA tensor, got one on cpu",
         lambda m: m.dequantize_rows(cpu(1, 8).to(torch.int8), zeros(1, 2), 4, FP16)),
    case("dequantize_rows-codes-uint8", "codes must be torch.int8, got torch.uint8",
         lambda m: m.dequantize_rows(zeros(1, 8, dtype=torch.uint8), zeros(1, 2), 4, FP16)),
    case("dequantize_rows-scales-float16", "scales must be torch.float32, got torch.float16",
         lambda m: m.dequantize_rows(i8(1, 8), f16(1, 2), 4, FP16)),
    case("dequantize_rows-inner-stride", "rows must be contiguous (inner stride 1)",
         lambda m: m.dequantize_rows(i8(2, 16)[:, ::2], zeros(2, 2), 4, FP16)),
    case("dequantize_rows-row-strides",
         "codes and scales rows must lie equally many bytes apart, got row strides 12 bytes and 2 floats",
         lambda m: m.dequantize_rows(i8(2, 12), zeros(2, 2), 4, FP16)),
    case("dequantize_rows-scale-count",
         "scales must hold one value per group of group_size in a row: 8 codes a row in groups of 4, got 1",
         lambda m: m.dequantize_rows(i8(1, 8), zeros(1, 1), 4, FP16)),
    case("dequantize_rows-format-id", NOT_A_FORMAT_ID + "-1",
         lambda m: m.dequantize_rows(i8(1, 8), zeros(1, 2), 4, -1)),
    # dequantize_parts_into(codes [k, n], scales [k, G], group_size, first_columns, outs [k, m_i])
    case("dequantize_parts_into-flat", "codes must be [k, n] and scales [k, G] with as many rows",
         lambda m: m.dequantize_parts_into(i8(8), zeros(1, 2), 4, [0], [zeros(1, 8)])),
    case("dequantize_parts_into-out-rows", "every out must be [k, m] with the codes' 1 rows, got sizes [2, 4]",
         lambda m: m.dequantize_parts_into(i8(1, 8), zeros(1, 2), 4, [0], [zeros(2, 4)])),
    case("dequantize_parts_into-out-cpu", "out must be a CUDA tensor, got one on cpu",
         lambda m: m.dequantize_parts_into(i8(1, 8), zeros(1, 2), 4, [0], [cpu(1, 8)])),
    case("dequantize_parts_into-out-strided", "out must be contiguous",
         lambda m: m.dequantize_parts_into(i8(1, 8), zeros(1, 2), 4, [0], [zeros(1, 16)[:, ::2]])),
    case("dequantize_parts_into-out-float64", "out must be torch.float16, torch.bfloat16 or torch.float32, got "
         "torch.float64", lambda m: m.dequantize_parts_into(i8(1, 8), zeros(1, 2), 4, [0], [f64(1, 8)])),
    case("dequantize_parts_into-codes-uint8", "codes must be torch.int8, got torch.uint8",
         lambda m: m.dequantize_parts_into(zeros(1, 8, dtype=torch.uint8), zeros(1, 2), 4, [0], [zeros(1, 8)])),
    case("dequantize_parts_into-row-strides",
         "codes and scales rows must lie equally many bytes apart, got row strides 12 bytes and 2 floats",
         lambda m: m.dequantize_parts_into(i8(2, 12), zeros(2, 2), 4, [0], [zeros(2, 12)])),
    case("dequantize_parts_into-scale-count",
         "group_size must be >= 1 and scales must hold a value per group of the 8 columns, got group_size 4 and 1",
         lambda m: m.dequantize_parts_into(i8(1, 8), zeros(1, 1), 4, [0], [zeros(1, 8)])),
    case("dequantize_parts_into-count", "one first column per output, got 2 first columns and 1 outputs",
         lambda m: m.dequantize_parts_into(i8(1, 8), zeros(1, 2), 4, [0, 4], [zeros(1, 4)])),
    case("dequantize_parts_into-negative-column", "part 0: columns -1 to 3 do not lie within the 8 columns",
         lambda m: m.dequantize_parts_into(i8(1, 8), zeros(1, 2), 4, [-1], [zeros(1, 4)])),
    case("dequantize_parts_into-past-the-end", "part 1: columns 6 to 10 do not lie within the 8 columns",
         lambda m: m.dequantize_parts_into(i8(1, 8), zeros(1, 2), 4, [0, 6], [zeros(1, 4), zeros(1, 4)])),
    # qgz_encode(input, destinations, rows, chunk, padded_chunk)
    case("qgz_encode-cpu", "input must be a CUDA tensor, got one on cpu",
         lambda m: m.qgz_encode(cpu(1000), 2, 1, 500, PADDED)),
    case("qgz_encode-float64", NOT_A_FORMAT + "torch.float64", lambda m: m.qgz_encode(f64(1000), 2, 1, 500, PADDED)),
    case("qgz_encode-2d", "input must be 1-D, got sizes [2, 500]",
         lambda m: m.qgz_encode(zeros(2, 500), 2, 1, 500, PADDED)),
    case("qgz_encode-strided", "input must be contiguous", lambda m: m.qgz_encode(strided(1000), 2, 1, 500, PADDED)),
    case("qgz_encode-destinations", "destinations must be in [1, 2^31), got 0",
         lambda m: m.qgz_encode(zeros(1000), 0, 1, 500, PADDED)),
    case("qgz_encode-rows", "rows must be in [1, 2^31), got 0",
         lambda m: m.qgz_encode(zeros(1000), 2, 0, 500, PADDED)),
    case("qgz_encode-padded-chunk", f"padded_chunk must be a non-negative multiple of {GROUP}, got 500",
         lambda m: m.qgz_encode(zeros(1000), 2, 1, 500, 500)),
    case("qgz_encode-chunk", f"chunk must be in [0, padded_chunk = {PADDED}], got {PADDED + 1}",
         lambda m: m.qgz_encode(zeros(1000), 2, 1, PADDED + 1, PADDED)),
    case("qgz_encode-cover", f"2 x 1 chunks of {GROUP} do not cover the input's 1000 values",
         lambda m: m.qgz_encode(zeros(1000), 2, 1, GROUP, GROUP)),
    case("qgz_encode-groups", f"at most 2^31 - 1 groups of {GROUP} per call",
         lambda m: m.qgz_encode(zeros(1000), 2**30, 2**30, 500, PADDED)),
    # qgz_encode_feedback(input, error, beta, keep, destinations, rows, chunk, padded_chunk)
    case("qgz_encode_feedback-input-int8", NOT_A_FORMAT + "torch.int8",
         lambda m: m.qgz_encode_feedback(i8(1000), zeros(2 * PADDED), BETA, KEEP, 2, 1, 500, PADDED)),
    case("qgz_encode_feedback-error-float16", "the error buffer must be torch.float32, got torch.float16",
         lambda m: m.qgz_encode_feedback(zeros(1000), f16(2 * PADDED), BETA, KEEP, 2, 1, 500, PADDED)),
    case("qgz_encode_feedback-error-cpu", "the error buffer must be a CUDA tensor, got one on cpu",
         lambda m: m.qgz_encode_feedback(zeros(1000), cpu(2 * PADDED), BETA, KEEP, 2, 1, 500, PADDED)),
    case("qgz_encode_feedback-error-size", f"the error buffer holds 1000 values, expected {2 * PADDED}",
         lambda m: m.qgz_encode_feedback(zeros(1000), zeros(1000), BETA, KEEP, 2, 1, 500, PADDED)),
    case("qgz_encode_feedback-error-aligned", "the error buffer must be 16-byte aligned",
         lambda m: m.qgz_encode_feedback(zeros(1000), misaligned(2 * PADDED, 4), BETA, KEEP, 2, 1, 500, PADDED)),
    # qgz_reduce_encode(blocks, rows, padded_chunk)
    case("qgz_reduce_encode-float32", "blocks must be torch.uint8, got torch.float32",
         lambda m: m.qgz_reduce_encode(zeros(2, ROW_BYTES), 1, PADDED)),
    case("qgz_reduce_encode-cpu", "blocks must be a CUDA tensor, got one on cpu",
         lambda m: m.qgz_reduce_encode(blocks(device="cpu"), 1, PADDED)),
    case("qgz_reduce_encode-flat", "blocks must be 2-D [sources, bytes], got sizes",
         lambda m: m.qgz_reduce_encode(blocks().view(-1), 1, PADDED)),
    case("qgz_reduce_encode-no-sources", "blocks need 1 to 2^31 - 1 sources, got 0",
         lambda m: m.qgz_reduce_encode(blocks(sources=0), 1, PADDED)),
    case("qgz_reduce_encode-bytes",
         f"blocks hold {ROW_BYTES} bytes per source, expected {block_bytes(2, PADDED)} (2 rows of {PADDED})",
         lambda m: m.qgz_reduce_encode(blocks(rows=1), 2, PADDED)),
    case("qgz_reduce_encode-aligned", "blocks must be 4-byte aligned",
         lambda m: m.qgz_reduce_encode(misaligned_blocks(1), 1, PADDED)),
    # qgz_reduce_encode_feedback(blocks, error, beta, keep, rows, padded_chunk)
    case("qgz_reduce_encode_feedback-blocks-int8", "blocks must be torch.uint8, got torch.int8",
         lambda m: m.qgz_reduce_encode_feedback(blocks().view(torch.int8), zeros(PADDED), BETA, KEEP, 1, PADDED)),
    case("qgz_reduce_encode_feedback-error-size", f"the error buffer holds {2 * PADDED} values, expected {PADDED}",
         lambda m: m.qgz_reduce_encode_feedback(blocks(), zeros(2 * PADDED), BETA, KEEP, 1, PADDED)),
    case("qgz_reduce_encode_feedback-error-2d", f"the error buffer must be 1-D, got sizes [2, {GROUP}]",
         lambda m: m.qgz_reduce_encode_feedback(blocks(), zeros(2, GROUP), BETA, KEEP, 1, PADDED)),
    # qgz_decode_sum(blocks, padded_chunk, factor, out)
    case("qgz_decode_sum-out-float64", NOT_A_FORMAT_OUT + "torch.float64",
         lambda m: m.qgz_decode_sum(blocks(), PADDED, 0.5, f64(PADDED))),
    case("qgz_decode_sum-out-cpu", "out must be a CUDA tensor, got one on cpu",
         lambda m: m.qgz_decode_sum(blocks(), PADDED, 0.5, cpu(PADDED))),
    case("qgz_decode_sum-out-size", f"out must hold at most padded_chunk = {PADDED} values, got {PADDED + 1}",
         lambda m: m.qgz_decode_sum(blocks(), PADDED, 0.5, zeros(PADDED + 1))),
    case("qgz_decode_sum-out-strided", "out must be contiguous",
         lambda m: m.qgz_decode_sum(blocks(), PADDED, 0.5, strided(PADDED))),
    case("qgz_decode_sum-padded-chunk", f"padded_chunk must be a non-negative multiple of {GROUP}, got 100",
         lambda m: m.qgz_decode_sum(blocks(), 100, 0.5, zeros(10))),
]


@pytest.fixture(scope="module")
def extension(extension_builds):  # noqa: F811
    return cuda_backend._extension()


@pytest.mark.parametrize("call,message", CASES)
def test_wrong_argument_raises_runtime_error_naming_it(extension, call, message):
    with pytest.raises(RuntimeError, match=re.escape(message)):
        call(extension)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_tensors_on_two_devices_are_refused(extension):
    other = torch.device("cuda", 1)
    with pytest.raises(RuntimeError, match=re.escape("scales must be on the device of codes (cuda:0), got cuda:1")):
        extension.dequantize(zeros(8, dtype=torch.int8, device="cuda:0"), zeros(2, device=other), 4, 4, FP32)
    with pytest.raises(RuntimeError, match=re.escape("out must be on the device of blocks (cuda:0), got cuda:1")):
        extension.qgz_decode_sum(blocks(device="cuda:0"), PADDED, 0.5, zeros(PADDED, device=other))


def test_extension_computes_after_the_errors(extension):
    """After every refused call above, the same process still quantizes, dequantizes and encodes: no launch ran on bad
    arguments, so the CUDA context is intact."""
    x = torch.arange(-4, 4, dtype=torch.float32, device="cuda")
    codes, scales = extension.quantize(x, 1, 8)
    assert torch.equal(scales.cpu(), torch.tensor([4 / 128]))
    assert torch.equal(extension.dequantize(codes, scales, 8, 8, FP32), x)
    assert extension.qgz_encode(torch.ones(1000, device="cuda"), 2, 1, 500, PADDED).shape == (2, ROW_BYTES)
    torch.cuda.synchronize()
