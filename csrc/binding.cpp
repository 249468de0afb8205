// Python binding of the native quantizer: tensor checks, output allocation, device guard and current stream.
//
// Only the light ATen/pybind headers are included (not torch/extension.h) to keep the cold JIT build short.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/utils/pybind.h>

#include <cstdint>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "quantizer.h"
#include "wire_formats.h"

namespace {

// ---- One error policy: TORCH_CHECK ----
//
// Every entry point checks its tensors (device, dtype, layout) and sizes with TORCH_CHECK before it allocates or
// launches. The c10::Error it throws reaches Python as RuntimeError with the message (tests/gpu/test_native_errors.py
// calls each entry point with each kind of wrong argument). The Python wrappers (ops.py, backends/cuda.py) check the
// same things first and raise the user-facing TypeError / ValueError; these checks are the last line, for callers
// that bypass them, so that no kernel runs on memory that does not fit it.
//
// What crashed the interpreter. This file once threw std exceptions and left the qgZ functions unchecked because "an
// exception thrown from this extension crashed the interpreter (torch 2.11, CUDA 13)". Minimal extensions built the
// way backends/cuda.py builds this one (torch.utils.cpp_extension.load, -O3; on the H200 host that compiles with
// /opt/gcc/bin/g++ and nvcc -ccbin /opt/gcc/bin/gcc, torch 2.11.0+cu130) show that exceptions are not the cause:
// std::runtime_error, std::invalid_argument and a TORCH_CHECK whose message holds only text or a device all arrive
// as RuntimeError / ValueError, thrown from g++- or nvcc-compiled code alike; but a TORCH_CHECK whose message holds
// an integer (TORCH_CHECK(n >= 1, "got ", n)) or sizes (ArrayRef's operator<< prints integers) dies with SIGSEGV,
// and a c10::Error leaving a destructor reports "terminate called without an active exception". Both point to a
// library that carries its own copy of C++ runtime parts beside the process's libstdc++.so.6: built locally with
// -static-libstdc++, the same extensions print "terminate called without an active exception" too, and their integer
// output fails (the number and every piece after it are dropped: the private copy's locale facet ids do not match the
// locale the shared runtime made; on the host the mismatch segfaults instead). So formatting a number through an
// iostream in this library is the crash, and TORCH_CHECK(cond, "...", n) formats its pieces in the caller's code
// through std::ostringstream; the old require() built its std exceptions' messages the same way (c10::str), which
// fits "they crashed too". So: messages are built without iostreams (below), every entry point is an m.def (pybind11
// catches and translates what it throws; a raw CPython function or a noexcept one would let an exception reach
// std::terminate), and nothing here throws from a destructor.

// Every TORCH_CHECK message is one std::string put together here, from text made without iostreams: numbers by
// std::to_string, sizes and strides by `text`, devices by c10::Device::str() (formatted inside libc10). TORCH_CHECK
// passes a message of one string on as it is; several pieces would go through an std::ostringstream here.
std::string text(const char* piece) { return piece; }
std::string text(const std::string& piece) { return piece; }
std::string text(const c10::Device& device) { return device.str(); }

template <typename Integer, typename = std::enable_if_t<std::is_integral<Integer>::value>>
std::string text(Integer value)
{
    return std::to_string(value);
}

std::string text(at::IntArrayRef values)
{
    std::string joined = "[";
    for (size_t i = 0; i < values.size(); ++i) joined += (i == 0 ? "" : ", ") + std::to_string(values[i]);
    return joined + "]";
}

template <typename... Pieces>
std::string message(const Pieces&... pieces)
{
    std::string joined;
    (joined += ... += text(pieces));
    return joined;
}

// A dtype as Python spells it (torch.float16, not Half), for the messages.
std::string dtype_name(at::ScalarType type)
{
    switch (type) {
        case at::kHalf: return "torch.float16";
        case at::kBFloat16: return "torch.bfloat16";
        case at::kFloat: return "torch.float32";
        case at::kDouble: return "torch.float64";
        case at::kChar: return "torch.int8";
        case at::kByte: return "torch.uint8";
        case at::kShort: return "torch.int16";
        case at::kInt: return "torch.int32";
        case at::kLong: return "torch.int64";
        case at::kBool: return "torch.bool";
        default: return c10::toString(type);
    }
}

dszpp::Format format_of(at::ScalarType type, const char* what)
{
    switch (type) {
        case at::kHalf: return dszpp::Format::kHalf;
        case at::kBFloat16: return dszpp::Format::kBFloat16;
        case at::kFloat: return dszpp::Format::kFloat;
        default: break;
    }
    TORCH_CHECK(false,
                message(what, " must be torch.float16, torch.bfloat16 or torch.float32, got ", dtype_name(type)));
}

// Output formats arrive as a small int (one pybind argument conversion cheaper than a dtype object): backends/cuda.py's
// _FORMAT_IDS.
at::ScalarType scalar_type_of(int64_t format_id)
{
    switch (format_id) {
        case 0: return at::kHalf;
        case 1: return at::kBFloat16;
        case 2: return at::kFloat;
        default: break;
    }
    TORCH_CHECK(false,
                message("format id must be 0 (torch.float16), 1 (torch.bfloat16) or 2 (torch.float32), got ",
                        format_id));
}

void check_cuda(const at::Tensor& t, const char* what)
{
    TORCH_CHECK(t.is_cuda(), message(what, " must be a CUDA tensor, got one on ", t.device()));
}

void check_dtype(const at::Tensor& t, at::ScalarType type, const char* what)
{
    TORCH_CHECK(t.scalar_type() == type,
                message(what, " must be ", dtype_name(type), ", got ", dtype_name(t.scalar_type())));
}

void check_same_device(const at::Tensor& t, const at::Tensor& reference, const char* what, const char* reference_what)
{
    TORCH_CHECK(t.device() == reference.device(),
                message(what, " must be on the device of ", reference_what, " (", reference.device(), "), got ",
                        t.device()));
}

// A contiguous CUDA tensor (read flat), optionally of one dtype.
void check_contiguous_cuda(const at::Tensor& t, const char* what)
{
    check_cuda(t, what);
    TORCH_CHECK(t.is_contiguous(),
                message(what, " must be contiguous, got strides ", t.strides(), " for sizes ", t.sizes()));
}

void check_contiguous_cuda(const at::Tensor& t, at::ScalarType type, const char* what)
{
    check_contiguous_cuda(t, what);
    check_dtype(t, type, what);
}

void check_flat_cuda(const at::Tensor& t, const char* what)
{
    check_contiguous_cuda(t, what);
    TORCH_CHECK(t.dim() == 1, message(what, " must be 1-D, got sizes ", t.sizes()));
}

void check_aligned(const at::Tensor& t, int64_t bytes, const char* what)
{
    TORCH_CHECK(reinterpret_cast<uintptr_t>(t.data_ptr()) % bytes == 0,
                message(what, " must be ", bytes, "-byte aligned"));
}

// ---- One allocation and guard style ----

// Every output: at::empty on the input's device, in the output's dtype.
at::Tensor empty_like_on(const at::Tensor& like, at::IntArrayRef sizes, at::ScalarType type)
{
    return at::empty(sizes, like.options().dtype(type));
}

// Makes the tensor's device current for the allocation and the launch, and names the stream to launch on (that
// device's current stream). ZeRO-3 calls with tensors on the current device, so the guard (which restores the
// previous device afterwards) is only engaged when they differ: restoring the device on every call cost host time.
class OnDevice {
public:
    explicit OnDevice(const at::Tensor& tensor) : index_(tensor.device().index())
    {
        if (c10::cuda::current_device() != index_) guard_.set_device(tensor.device());
    }
    cudaStream_t stream() const { return c10::cuda::getCurrentCUDAStream(index_); }

private:
    c10::DeviceIndex index_;
    c10::cuda::OptionalCUDAGuard guard_;
};

// ---- int8 weights ----

// The groups quantize and quantize_into take: `groups` groups of `group_size` elements, the last one ending at numel
// (it may be shorter), in the 32-bit ranges the kernels index with.
void check_groups(int64_t numel, int64_t groups, int64_t group_size)
{
    TORCH_CHECK(groups >= 1 && groups <= INT32_MAX, message("groups must be in [1, 2^31 - 1], got ", groups));
    TORCH_CHECK(group_size >= 0 && group_size < INT32_MAX - 64,
                message("group_size must be in [0, 2^31 - 65) (groups of 2^31 or more elements are not supported), ",
                        "got ", group_size));
    TORCH_CHECK(numel <= groups * group_size && (numel == 0 || (groups - 1) * group_size < numel),
                message(groups, " groups of ", group_size, " elements do not cover ", numel,
                        " elements with at least one element in the last group"));
}

// The quantize launch for inputs already checked, into `codes` (input's numel) and `scales` (`groups`) on the
// current stream of the input's device, which `device` has made current.
void launch_quantize_into(const OnDevice& device,
                          const at::Tensor& input,
                          dszpp::Format format,
                          int64_t groups,
                          int64_t group_size,
                          int8_t* codes,
                          float* scales)
{
    dszpp::launch_quantize(format, input.data_ptr(), codes, scales, groups, group_size, input.numel(), device.stream());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// `groups` groups of `group_size` elements, the last one ending at numel (it may be shorter). Any contiguous input is
// read flat; the codes get its shape.
std::tuple<at::Tensor, at::Tensor> quantize(const at::Tensor& input, int64_t groups, int64_t group_size)
{
    check_contiguous_cuda(input, "input");
    const dszpp::Format format = format_of(input.scalar_type(), "input");
    check_groups(input.numel(), groups, group_size);
    const OnDevice device(input);
    at::Tensor codes = empty_like_on(input, input.sizes(), at::kChar);
    at::Tensor scales = empty_like_on(input, {groups}, at::kFloat);
    launch_quantize_into(device, input, format, groups, group_size, codes.data_ptr<int8_t>(), scales.data_ptr<float>());
    return {codes, scales};
}

// quantize() writing into the caller's `codes` (int8, input's numel) and `scales` (fp32, `groups`): views of a
// packet buffer, so that codes and scales leave in one all-gather without a copy.
void quantize_into(
    const at::Tensor& input, int64_t groups, int64_t group_size, at::Tensor& codes, at::Tensor& scales)
{
    check_contiguous_cuda(input, "input");
    const dszpp::Format format = format_of(input.scalar_type(), "input");
    check_contiguous_cuda(codes, at::kChar, "codes");
    check_contiguous_cuda(scales, at::kFloat, "scales");
    check_same_device(codes, input, "codes", "input");
    check_same_device(scales, input, "scales", "input");
    const int64_t numel = input.numel();
    check_groups(numel, groups, group_size);
    TORCH_CHECK(codes.numel() == numel, message("codes must hold the input's ", numel, " values, got ", codes.numel()));
    TORCH_CHECK(scales.numel() == groups,
                message("scales must hold ", groups, " values (one per group), got ", scales.numel()));
    const OnDevice device(input);
    launch_quantize_into(device, input, format, groups, group_size, codes.data_ptr<int8_t>(), scales.data_ptr<float>());
}

// quantize_into() for several inputs of one device and dtype at once: inputs[i] into codes[i] and scales[i], in
// groups[i] groups of group_sizes[i] elements; at most dszpp::kMaxSegments inputs, fewer than 2^31 groups in all. One
// kernel where every input and its codes start on 16-byte boundaries (quantizer.h).
void quantize_many_into(const std::vector<at::Tensor>& inputs,
                        const std::vector<int64_t>& groups,
                        const std::vector<int64_t>& group_sizes,
                        const std::vector<at::Tensor>& codes,
                        const std::vector<at::Tensor>& scales)
{
    const int64_t count = static_cast<int64_t>(inputs.size());
    TORCH_CHECK(static_cast<int64_t>(groups.size()) == count && static_cast<int64_t>(group_sizes.size()) == count &&
                    static_cast<int64_t>(codes.size()) == count && static_cast<int64_t>(scales.size()) == count,
                message("one group count, group size, codes and scales per input, got ", count, " inputs, ",
                        static_cast<int64_t>(groups.size()), " group counts, ",
                        static_cast<int64_t>(group_sizes.size()), " group sizes, ",
                        static_cast<int64_t>(codes.size()), " codes and ", static_cast<int64_t>(scales.size()),
                        " scales"));
    TORCH_CHECK(count <= dszpp::kMaxSegments,
                message("at most ", static_cast<int64_t>(dszpp::kMaxSegments), " inputs per call, got ", count));
    if (count == 0) return;
    const dszpp::Format format = format_of(inputs[0].scalar_type(), "input");
    std::vector<dszpp::QuantizeSegment> segments;
    segments.reserve(count);
    int64_t blocks = 0;
    for (int64_t i = 0; i < count; ++i) {
        const at::Tensor& input = inputs[i];
        check_contiguous_cuda(input, "input");
        check_same_device(input, inputs[0], "input", "the first input");
        TORCH_CHECK(input.scalar_type() == inputs[0].scalar_type(),
                    message("every input must have the first input's dtype ", dtype_name(inputs[0].scalar_type()),
                            ", got ", dtype_name(input.scalar_type()), " at input ", i));
        check_contiguous_cuda(codes[i], at::kChar, "codes");
        check_contiguous_cuda(scales[i], at::kFloat, "scales");
        check_same_device(codes[i], input, "codes", "input");
        check_same_device(scales[i], input, "scales", "input");
        const int64_t numel = input.numel();
        check_groups(numel, groups[i], group_sizes[i]);
        TORCH_CHECK(codes[i].numel() == numel,
                    message("codes ", i, " must hold input ", i, "'s ", numel, " values, got ", codes[i].numel()));
        TORCH_CHECK(scales[i].numel() == groups[i], message("scales ", i, " must hold ", groups[i],
                                                            " values (one per group), got ", scales[i].numel()));
        if (numel == 0) continue;
        blocks += groups[i];
        TORCH_CHECK(blocks <= INT32_MAX, message("at most 2^31 - 1 groups per call, got more by input ", i));
        segments.push_back(dszpp::QuantizeSegment{input.data_ptr(), codes[i].data_ptr<int8_t>(),
                                                  scales[i].data_ptr<float>(), groups[i], group_sizes[i], numel});
    }
    if (segments.empty()) return;
    const OnDevice device(inputs[0]);
    dszpp::launch_quantize_segments(format, segments.data(), static_cast<int64_t>(segments.size()), device.stream());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// Returns a new tensor of the codes' shape in the format `format_id` names. A block_numel that is a multiple of
// group_size means equal groups; any other: per-block layouts (quantizer.h). Scales may be [S] or [S, 1]: only their
// count matters.
at::Tensor dequantize(
    const at::Tensor& codes, const at::Tensor& scales, int64_t group_size, int64_t block_numel, int64_t format_id)
{
    check_contiguous_cuda(codes, at::kChar, "codes");
    check_contiguous_cuda(scales, at::kFloat, "scales");
    check_same_device(scales, codes, "scales", "codes");
    TORCH_CHECK(group_size >= 1 && block_numel >= 1,
                message("group_size and block_numel must be >= 1, got ", group_size, " and ", block_numel));
    const at::ScalarType out_type = scalar_type_of(format_id);
    const int64_t numel = codes.numel();
    // Counts by division, so that no product of the arguments can overflow.
    const auto ceil_div = [](int64_t a, int64_t b) { return a / b + (a % b != 0); };
    if (block_numel % group_size == 0) {
        TORCH_CHECK(ceil_div(numel, group_size) <= scales.numel(),
                    message(numel, " codes do not fit ", scales.numel(), " groups of ", group_size));
    } else {
        const int64_t block_groups = ceil_div(block_numel, group_size);
        TORCH_CHECK(scales.numel() % block_groups == 0 && ceil_div(numel, block_numel) <= scales.numel() / block_groups,
                    message(numel, " codes with ", scales.numel(), " scales do not fit blocks of ", block_numel,
                            " elements in ", block_groups, " groups of ", group_size));
    }
    const OnDevice device(codes);
    at::Tensor out = empty_like_on(codes, codes.sizes(), out_type);
    dszpp::launch_dequantize(format_of(out_type, "out"),
                             codes.data_ptr<int8_t>(),
                             scales.data_ptr<float>(),
                             out.data_ptr(),
                             numel,
                             group_size,
                             block_numel,
                             device.stream());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}

// Per-rank rows read in place from a gathered buffer of packets: `codes` [k, n] int8 and `scales` [k, G] fp32,
// views with unit inner stride whose rows lie the same number of bytes apart. Returns a new [k, n] tensor.
at::Tensor dequantize_rows(const at::Tensor& codes, const at::Tensor& scales, int64_t group_size, int64_t format_id)
{
    check_cuda(codes, "codes");
    check_cuda(scales, "scales");
    check_dtype(codes, at::kChar, "codes");
    check_dtype(scales, at::kFloat, "scales");
    check_same_device(scales, codes, "scales", "codes");
    TORCH_CHECK(codes.dim() == 2 && scales.dim() == 2 && codes.size(0) == scales.size(0),
                message("codes must be [k, n] and scales [k, G] with as many rows, got sizes ", codes.sizes(), " and ",
                        scales.sizes()));
    TORCH_CHECK(codes.stride(1) == 1 && scales.stride(1) == 1,
                message("rows must be contiguous (inner stride 1), got strides ", codes.strides(), " and ",
                        scales.strides()));
    const int64_t rows = codes.size(0), numel = codes.size(1);
    TORCH_CHECK(rows <= 65535, message("at most 65535 rows are read per call, got ", rows));
    TORCH_CHECK(rows == 1 || codes.stride(0) == scales.stride(0) * 4,
                message("codes and scales rows must lie equally many bytes apart, got row strides ", codes.stride(0),
                        " bytes and ", scales.stride(0), " floats"));
    TORCH_CHECK(group_size >= 1 && scales.size(1) == (numel + group_size - 1) / group_size,
                message("scales must hold one value per group of group_size in a row: ", numel,
                        " codes a row in groups of ", group_size, ", got ", scales.size(1), " scales a row"));
    const at::ScalarType out_type = scalar_type_of(format_id);
    const OnDevice device(codes);
    at::Tensor out = empty_like_on(codes, {rows, numel}, out_type);
    dszpp::launch_dequantize_rows(format_of(out_type, "out"),
                                  codes.data_ptr<int8_t>(),
                                  scales.data_ptr<float>(),
                                  rows == 1 ? 0 : codes.stride(0),
                                  out.data_ptr(),
                                  numel,
                                  rows * numel,
                                  group_size,
                                  device.stream());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}

// Each parameter's part of every rank's packet, written straight into a buffer of its own: `codes` [k, n] int8 and
// `scales` [k, G] fp32, the packets' whole rows (views with unit inner stride, rows lying equally many bytes apart as
// in dequantize_rows); part i is columns [first_columns[i], first_columns[i] + m) of every row, written into
// outs[i], a contiguous [k, m] tensor of fp16, bf16 or fp32 on the same device. Group of column c: c / group_size.
void dequantize_parts_into(const at::Tensor& codes,
                           const at::Tensor& scales,
                           int64_t group_size,
                           const std::vector<int64_t>& first_columns,
                           const std::vector<at::Tensor>& outs)
{
    check_cuda(codes, "codes");
    check_cuda(scales, "scales");
    check_dtype(codes, at::kChar, "codes");
    check_dtype(scales, at::kFloat, "scales");
    check_same_device(scales, codes, "scales", "codes");
    TORCH_CHECK(codes.dim() == 2 && scales.dim() == 2 && codes.size(0) == scales.size(0),
                message("codes must be [k, n] and scales [k, G] with as many rows, got sizes ", codes.sizes(), " and ",
                        scales.sizes()));
    TORCH_CHECK(codes.stride(1) == 1 && scales.stride(1) == 1,
                message("rows must be contiguous (inner stride 1), got strides ", codes.strides(), " and ",
                        scales.strides()));
    const int64_t rows = codes.size(0), columns = codes.size(1);
    TORCH_CHECK(rows <= 65535, message("at most 65535 rows are read per call, got ", rows));
    TORCH_CHECK(rows == 1 || codes.stride(0) == scales.stride(0) * 4,
                message("codes and scales rows must lie equally many bytes apart, got row strides ", codes.stride(0),
                        " bytes and ", scales.stride(0), " floats"));
    TORCH_CHECK(group_size >= 1 && scales.size(1) >= (columns + group_size - 1) / group_size,
                message("group_size must be >= 1 and scales must hold a value per group of the ", columns,
                        " columns, got group_size ", group_size, " and ", scales.size(1), " scales a row"));
    TORCH_CHECK(first_columns.size() == outs.size(),
                message("one first column per output, got ", static_cast<int64_t>(first_columns.size()),
                        " first columns and ", static_cast<int64_t>(outs.size()), " outputs"));
    std::vector<dszpp::Part> parts;
    parts.reserve(outs.size());
    for (size_t i = 0; i < outs.size(); ++i) {
        const at::Tensor& out = outs[i];
        check_contiguous_cuda(out, "out");
        check_same_device(out, codes, "out", "codes");
        const dszpp::Format format = format_of(out.scalar_type(), "out");
        TORCH_CHECK(out.dim() == 2 && out.size(0) == rows,
                    message("every out must be [k, m] with the codes' ", rows, " rows, got sizes ", out.sizes()));
        const int64_t first = first_columns[i], numel = out.size(1);
        // first <= columns - numel rather than first + numel <= columns: no overflow
        TORCH_CHECK(first >= 0 && first <= columns - numel,
                    message("part ", static_cast<int64_t>(i), ": columns ", first, " to ", first + numel,
                            " do not lie within the ", columns, " columns of the codes"));
        if (numel > 0) parts.push_back(dszpp::Part{format, first, numel, out.data_ptr()});
    }
    if (rows == 0 || parts.empty()) return;
    const OnDevice device(codes);
    dszpp::launch_dequantize_parts(codes.data_ptr<int8_t>(),
                                   scales.data_ptr<float>(),
                                   rows == 1 ? 0 : codes.stride(0),
                                   rows,
                                   parts.data(),
                                   static_cast<int64_t>(parts.size()),
                                   group_size,
                                   device.stream());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// ---- qgZ and LoCo ----
//
// The same conditions as backends/cuda.py's _check_qgz calls (which raise the user-facing ValueError first), in the
// int ranges of the static_casts below.

using dszpp::int4::block_bytes;
using dszpp::int4::kGroup;

// rows in [1, 2^31), padded_chunk a non-negative multiple of kGroup, and at most 2^31 - 1 groups in `blocks` blocks
// of `rows` rows (the kernels' 32-bit group index).
void check_geometry(int64_t blocks, int64_t rows, int64_t padded_chunk)
{
    TORCH_CHECK(rows >= 1 && rows <= INT32_MAX, message("rows must be in [1, 2^31), got ", rows));
    TORCH_CHECK(padded_chunk >= 0 && padded_chunk % kGroup == 0,
                message("padded_chunk must be a non-negative multiple of ", kGroup, ", got ", padded_chunk));
    const int64_t row_groups = padded_chunk / kGroup;
    // blocks and rows are below 2^31, so their product fits; the division keeps the last product from overflowing.
    TORCH_CHECK(row_groups == 0 || blocks * rows <= INT32_MAX / row_groups,
                message("at most 2^31 - 1 groups of ", kGroup, " per call, got ", blocks, " x ", rows, " rows of ",
                        row_groups));
}

// Blocks arrive from an all-to-all: [sources, block bytes], uint8, contiguous, 4-byte aligned for the word accesses.
void check_blocks(const at::Tensor& blocks, int64_t rows, int64_t padded_chunk)
{
    check_contiguous_cuda(blocks, at::kByte, "blocks");
    TORCH_CHECK(blocks.dim() == 2, message("blocks must be 2-D [sources, bytes], got sizes ", blocks.sizes()));
    TORCH_CHECK(blocks.size(0) >= 1 && blocks.size(0) <= INT32_MAX,
                message("blocks need 1 to 2^31 - 1 sources, got ", blocks.size(0)));
    check_geometry(1, rows, padded_chunk);
    TORCH_CHECK(blocks.size(1) == block_bytes(rows, padded_chunk),
                message("blocks hold ", blocks.size(1), " bytes per source, expected ", block_bytes(rows, padded_chunk),
                        " (", rows, " rows of ", padded_chunk, ")"));
    check_aligned(blocks, 4, "blocks");
}

// A gradient to encode: flat, contiguous, fp16/bf16/fp32, covered by destinations x rows chunks of `chunk` values.
dszpp::Format check_gradient(
    const at::Tensor& input, int64_t destinations, int64_t rows, int64_t chunk, int64_t padded_chunk)
{
    check_flat_cuda(input, "input");
    const dszpp::Format format = format_of(input.scalar_type(), "input");
    TORCH_CHECK(destinations >= 1 && destinations <= INT32_MAX,
                message("destinations must be in [1, 2^31), got ", destinations));
    check_geometry(destinations, rows, padded_chunk);
    TORCH_CHECK(chunk >= 0 && chunk <= padded_chunk,
                message("chunk must be in [0, padded_chunk = ", padded_chunk, "], got ", chunk));
    // Below 2^31 * kGroup: destinations * rows * padded_chunk is bounded by check_geometry.
    TORCH_CHECK(destinations * rows * chunk >= input.numel(),
                message(destinations, " x ", rows, " chunks of ", chunk, " do not cover the input's ", input.numel(),
                        " values"));
    return format;
}

// LoCo's error buffer: flat, contiguous, fp32, on `like`'s device, one value per encoded value, 16-byte aligned.
void check_error_buffer(const at::Tensor& error, const at::Tensor& like, const char* like_what, int64_t values)
{
    check_flat_cuda(error, "the error buffer");
    check_dtype(error, at::kFloat, "the error buffer");
    check_same_device(error, like, "the error buffer", like_what);
    TORCH_CHECK(error.numel() == values,
                message("the error buffer holds ", error.numel(), " values, expected ", values));
    check_aligned(error, 16, "the error buffer");
}

at::Tensor qgz_encode(const at::Tensor& input, int64_t destinations, int64_t rows, int64_t chunk, int64_t padded_chunk)
{
    const dszpp::Format format = check_gradient(input, destinations, rows, chunk, padded_chunk);
    const OnDevice device(input);
    at::Tensor out = empty_like_on(input, {destinations, block_bytes(rows, padded_chunk)}, at::kByte);
    dszpp::launch_qgz_encode(format,
                             input.data_ptr(),
                             input.numel(),
                             chunk,
                             padded_chunk,
                             static_cast<int>(destinations),
                             static_cast<int>(rows),
                             out.data_ptr<uint8_t>(),
                             device.stream());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}

at::Tensor qgz_reduce_encode(const at::Tensor& blocks, int64_t rows, int64_t padded_chunk)
{
    check_blocks(blocks, rows, padded_chunk);
    const OnDevice device(blocks);
    at::Tensor out = empty_like_on(blocks, {rows, block_bytes(1, padded_chunk)}, at::kByte);
    dszpp::launch_qgz_reduce_encode(blocks.data_ptr<uint8_t>(),
                                    static_cast<int>(blocks.size(0)),
                                    static_cast<int>(rows),
                                    padded_chunk,
                                    out.data_ptr<uint8_t>(),
                                    device.stream());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}

// LoCo: `error` is the fp32 error buffer, one value per encoded value, updated in place.
at::Tensor qgz_encode_feedback(const at::Tensor& input,
                               at::Tensor& error,
                               double beta,
                               double keep,
                               int64_t destinations,
                               int64_t rows,
                               int64_t chunk,
                               int64_t padded_chunk)
{
    const dszpp::Format format = check_gradient(input, destinations, rows, chunk, padded_chunk);
    check_error_buffer(error, input, "input", destinations * rows * padded_chunk);
    const OnDevice device(input);
    at::Tensor out = empty_like_on(input, {destinations, block_bytes(rows, padded_chunk)}, at::kByte);
    dszpp::launch_qgz_encode_feedback(format,
                                      input.data_ptr(),
                                      input.numel(),
                                      chunk,
                                      padded_chunk,
                                      static_cast<int>(destinations),
                                      static_cast<int>(rows),
                                      error.data_ptr<float>(),
                                      static_cast<float>(beta),
                                      static_cast<float>(keep),
                                      out.data_ptr<uint8_t>(),
                                      device.stream());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}

at::Tensor qgz_reduce_encode_feedback(const at::Tensor& blocks,
                                      at::Tensor& error,
                                      double beta,
                                      double keep,
                                      int64_t rows,
                                      int64_t padded_chunk)
{
    check_blocks(blocks, rows, padded_chunk);
    check_error_buffer(error, blocks, "blocks", rows * padded_chunk);
    const OnDevice device(blocks);
    at::Tensor out = empty_like_on(blocks, {rows, block_bytes(1, padded_chunk)}, at::kByte);
    dszpp::launch_qgz_reduce_encode_feedback(blocks.data_ptr<uint8_t>(),
                                             static_cast<int>(blocks.size(0)),
                                             static_cast<int>(rows),
                                             padded_chunk,
                                             error.data_ptr<float>(),
                                             static_cast<float>(beta),
                                             static_cast<float>(keep),
                                             out.data_ptr<uint8_t>(),
                                             device.stream());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}

// Writes into `out` (allocated by the caller in the gradient's dtype, flat, at most padded_chunk values).
void qgz_decode_sum(const at::Tensor& blocks, int64_t padded_chunk, double factor, at::Tensor& out)
{
    check_blocks(blocks, 1, padded_chunk);
    check_flat_cuda(out, "out");
    const dszpp::Format format = format_of(out.scalar_type(), "out");
    check_same_device(out, blocks, "out", "blocks");
    TORCH_CHECK(out.numel() <= padded_chunk,
                message("out must hold at most padded_chunk = ", padded_chunk, " values, got ", out.numel()));
    const OnDevice device(blocks);
    dszpp::launch_qgz_decode_sum(format,
                                 blocks.data_ptr<uint8_t>(),
                                 static_cast<int>(blocks.size(0)),
                                 padded_chunk,
                                 static_cast<float>(factor),
                                 out.data_ptr(),
                                 out.numel(),
                                 device.stream());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m)
{
    m.doc() = "deepspeed_zeropp native quantizers (fp16, bf16, fp32): int8 weights, qgZ 4-bit gradients";
    m.def("quantize", &quantize, "input, groups, group_size -> (int8 codes of input's shape, fp32 scales [groups])");
    m.def("dequantize",
          &dequantize,
          "codes, scales, group_size, block_numel, format id (0 fp16, 1 bf16, 2 fp32) -> codes[i] * scale of i");
    m.def("quantize_into", &quantize_into, "input, groups, group_size, codes, scales: quantize into given views");
    m.def("quantize_many_into",
          &quantize_many_into,
          "inputs, groups, group sizes, codes, scales (lists, at most MAX_SEGMENTS): quantize_into for each");
    m.attr("MAX_SEGMENTS") = static_cast<int64_t>(dszpp::kMaxSegments);
    m.def("dequantize_rows",
          &dequantize_rows,
          "codes [k, n], scales [k, G] (rows apart), group_size, format id -> [k, n] values");
    m.def("dequantize_parts_into",
          &dequantize_parts_into,
          "codes [k, n], scales [k, G] (whole rows), group_size, first columns, outs [k, m_i]: part i into outs[i]");
    m.def("qgz_encode", &qgz_encode, "qgZ: gradient, destinations, rows, chunk, padded_chunk -> uint8 blocks");
    m.def("qgz_reduce_encode", &qgz_reduce_encode, "qgZ: blocks, rows, padded_chunk -> summed, re-encoded blocks");
    m.def("qgz_encode_feedback",
          &qgz_encode_feedback,
          "LoCo: gradient, error, beta, 1 - beta, destinations, rows, chunk, padded_chunk -> blocks; error updated");
    m.def("qgz_reduce_encode_feedback",
          &qgz_reduce_encode_feedback,
          "LoCo: blocks, error, beta, 1 - beta, rows, padded_chunk -> re-encoded blocks; error updated");
    m.def("qgz_decode_sum", &qgz_decode_sum, "qgZ: blocks, padded_chunk, factor, out: out = sum * factor");
}
