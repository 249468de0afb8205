// Python binding of the native quantizer: tensor checks, output allocation, device guard and current stream.
//
// Only the light ATen/pybind headers are included (not torch/extension.h) to keep the cold JIT build short.
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAStream.h>
#include <ATen/ops/empty.h>
#include <ATen/cuda/EmptyTensor.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/csrc/utils/pybind.h>

#include <stdexcept>
#include <tuple>

#include "quantizer.h"
#include "wire_formats.h"

namespace {

// Last-resort argument checks, throwing std::invalid_argument (ValueError) rather than TORCH_CHECK's c10::Error. With
// torch 2.11 and CUDA 13 a c10::Error thrown by an extension built like this one has crashed the interpreter, and so
// have this extension's std exceptions: the Python wrappers (backends/cuda.py) check first.
template <typename... Args>
void require(bool ok, const Args&... message)
{
    if (!ok) throw std::invalid_argument(c10::str(message...));
}

dszpp::Format format_of(at::ScalarType type, const char* what)
{
    switch (type) {
        case at::kHalf: return dszpp::Format::kHalf;
        case at::kBFloat16: return dszpp::Format::kBFloat16;
        case at::kFloat: return dszpp::Format::kFloat;
        default: throw std::invalid_argument(c10::str(what, " must be float16, bfloat16 or float32, got ", type));
    }
}

void check_flat_cuda(const at::Tensor& t, const char* what)
{
    require(t.is_cuda(), what, " must be a CUDA tensor");
    require(t.dim() == 1 && t.is_contiguous(), what, " must be flat and contiguous");
}

// The int8 entry points read any contiguous tensor as flat and give their results its shape.
void check_contiguous_cuda(const at::Tensor& t, const char* what)
{
    require(t.is_cuda(), what, " must be a CUDA tensor");
    require(t.is_contiguous(), what, " must be contiguous");
}

// The int8 outputs come straight from the CUDA caching allocator (at::detail::empty_cuda) instead of through the
// operator dispatcher (at::empty): the same tensor for a fraction of a microsecond less, on a path ZeRO-3 takes for
// every gathered parameter or bucket.
at::Tensor empty_on(const at::Tensor& like, at::IntArrayRef sizes, at::ScalarType type)
{
    return at::Tensor(at::detail::empty_cuda(sizes, type, like.device(), std::nullopt));
}

at::ScalarType scalar_type_of(int64_t format_id)
{
    switch (format_id) {
        case 0: return at::kHalf;
        case 1: return at::kBFloat16;
        case 2: return at::kFloat;
        default:
            throw std::invalid_argument(c10::str("format id must be 0 (fp16), 1 (bf16) or 2 (fp32), got ", format_id));
    }
}

// `groups` groups of `group_size` elements, the last one ending at numel (it may be shorter).
std::tuple<at::Tensor, at::Tensor> quantize(const at::Tensor& input, int64_t groups, int64_t group_size)
{
    check_contiguous_cuda(input, "input");
    const dszpp::Format format = format_of(input.scalar_type(), "input");
    const int64_t numel = input.numel();
    require(groups >= 1 && group_size >= 0, "groups must be >= 1 and group_size >= 0");
    require(groups <= INT32_MAX, "at most 2^31 - 1 groups are supported");
    require(group_size < INT32_MAX - 64, "groups of 2^31 or more elements are not supported");
    require(numel <= groups * group_size && (numel == 0 || (groups - 1) * group_size < numel),
            "groups of group_size elements must cover numel, the last one holding at least one element");
    const c10::cuda::CUDAGuard device_guard(input.device());
    at::Tensor codes = empty_on(input, input.sizes(), at::kChar);
    at::Tensor scales = empty_on(input, {groups}, at::kFloat);
    dszpp::launch_quantize(format,
                           input.data_ptr(),
                           codes.data_ptr<int8_t>(),
                           scales.data_ptr<float>(),
                           groups,
                           group_size,
                           numel,
                           c10::cuda::getCurrentCUDAStream());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return {codes, scales};
}

// Returns a new tensor of the codes' shape in the format `format_id` names (a small int: one pybind argument
// conversion cheaper than a dtype object). A block_numel that is a multiple of group_size means equal groups; any
// other: per-block layouts (quantizer.h). Scales may be [S] or [S, 1]: only their count matters.
at::Tensor dequantize(
    const at::Tensor& codes, const at::Tensor& scales, int64_t group_size, int64_t block_numel, int64_t format_id)
{
    check_contiguous_cuda(codes, "codes");
    check_contiguous_cuda(scales, "scales");
    require(codes.scalar_type() == at::kChar, "codes must be int8");
    require(scales.scalar_type() == at::kFloat, "scales must be float32");
    require(codes.device() == scales.device(), "codes and scales on different devices");
    require(group_size >= 1 && block_numel >= 1, "group_size and block_numel must be >= 1");
    if (block_numel % group_size == 0) {
        require(codes.numel() <= scales.numel() * group_size, "codes do not fit the given groups and group_size");
    } else {
        const int64_t block_groups = (block_numel + group_size - 1) / group_size;
        require(scales.numel() % block_groups == 0 && codes.numel() <= scales.numel() / block_groups * block_numel,
                "codes do not fit blocks of block_numel elements with their scales");
    }
    const at::ScalarType out_type = scalar_type_of(format_id);
    const c10::cuda::CUDAGuard device_guard(codes.device());
    at::Tensor out = empty_on(codes, codes.sizes(), out_type);
    dszpp::launch_dequantize(format_of(out_type, "out"),
                             codes.data_ptr<int8_t>(),
                             scales.data_ptr<float>(),
                             out.data_ptr(),
                             codes.numel(),
                             group_size,
                             block_numel,
                             c10::cuda::getCurrentCUDAStream());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}

using dszpp::int4::block_bytes;
using dszpp::int4::kGroup;

void check_qgz_geometry(int64_t rows, int64_t padded_chunk)
{
    require(rows >= 1 && rows <= INT32_MAX, "rows must be in [1, 2^31), got ", rows);
    require(padded_chunk >= 0 && padded_chunk % kGroup == 0,
                "padded_chunk must be a non-negative multiple of ", kGroup, ", got ", padded_chunk);
}

// Blocks arrive from an all-to-all: [sources, block bytes], contiguous, 4-byte aligned for the word accesses.
int check_qgz_blocks(const at::Tensor& blocks, int64_t rows, int64_t padded_chunk)
{
    require(blocks.is_cuda(), "blocks must be a CUDA tensor");
    require(blocks.scalar_type() == at::kByte, "blocks must be uint8, got ", blocks.scalar_type());
    require(blocks.dim() == 2 && blocks.is_contiguous(), "blocks must be 2-D [sources, bytes] and contiguous");
    require(blocks.size(1) == block_bytes(rows, padded_chunk),
                "blocks hold ", blocks.size(1), " bytes per source, expected ", block_bytes(rows, padded_chunk));
    require(blocks.size(0) >= 1 && blocks.size(0) <= INT32_MAX, "blocks need 1 to 2^31 - 1 sources");
    require(reinterpret_cast<uintptr_t>(blocks.data_ptr()) % 4 == 0, "blocks must be 4-byte aligned");
    return static_cast<int>(blocks.size(0));
}

at::Tensor qgz_encode(const at::Tensor& input, int64_t destinations, int64_t rows, int64_t chunk, int64_t padded_chunk)
{
    check_flat_cuda(input, "input");
    const dszpp::Format format = format_of(input.scalar_type(), "input");
    check_qgz_geometry(rows, padded_chunk);
    require(destinations >= 1 && destinations <= INT32_MAX, "destinations must be in [1, 2^31)");
    require(chunk >= 0 && chunk <= padded_chunk, "chunk must be in [0, padded_chunk]");
    require(destinations * rows * chunk >= input.numel(), "destinations * rows chunks do not cover the input");
    const c10::cuda::CUDAGuard device_guard(input.device());
    at::Tensor out = at::empty({destinations, block_bytes(rows, padded_chunk)}, input.options().dtype(at::kByte));
    dszpp::launch_qgz_encode(format,
                             input.data_ptr(),
                             input.numel(),
                             chunk,
                             padded_chunk,
                             static_cast<int>(destinations),
                             static_cast<int>(rows),
                             out.data_ptr<uint8_t>(),
                             c10::cuda::getCurrentCUDAStream());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}

at::Tensor qgz_reduce_encode(const at::Tensor& blocks, int64_t rows, int64_t padded_chunk)
{
    check_qgz_geometry(rows, padded_chunk);
    const int sources = check_qgz_blocks(blocks, rows, padded_chunk);
    const c10::cuda::CUDAGuard device_guard(blocks.device());
    at::Tensor out = at::empty({rows, block_bytes(1, padded_chunk)}, blocks.options());
    dszpp::launch_qgz_reduce_encode(blocks.data_ptr<uint8_t>(),
                                    sources,
                                    static_cast<int>(rows),
                                    padded_chunk,
                                    out.data_ptr<uint8_t>(),
                                    c10::cuda::getCurrentCUDAStream());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}

// LoCo's fp32 error buffer: flat, contiguous, on the same device, one value per encoded value, 16-byte aligned.
void check_qgz_error(const at::Tensor& error, const at::Device& device, int64_t values)
{
    check_flat_cuda(error, "error");
    require(error.scalar_type() == at::kFloat, "error must be float32, got ", error.scalar_type());
    require(error.device() == device, "error and the input on different devices");
    require(error.numel() == values, "error holds ", error.numel(), " values, expected ", values);
    require(reinterpret_cast<uintptr_t>(error.data_ptr()) % 16 == 0, "error must be 16-byte aligned");
}

at::Tensor qgz_encode_feedback(const at::Tensor& input,
                               at::Tensor& error,
                               double beta,
                               double keep,
                               int64_t destinations,
                               int64_t rows,
                               int64_t chunk,
                               int64_t padded_chunk)
{
    check_flat_cuda(input, "input");
    const dszpp::Format format = format_of(input.scalar_type(), "input");
    check_qgz_geometry(rows, padded_chunk);
    require(destinations >= 1 && destinations <= INT32_MAX, "destinations must be in [1, 2^31)");
    require(chunk >= 0 && chunk <= padded_chunk, "chunk must be in [0, padded_chunk]");
    require(destinations * rows * chunk >= input.numel(), "destinations * rows chunks do not cover the input");
    check_qgz_error(error, input.device(), destinations * rows * padded_chunk);
    const c10::cuda::CUDAGuard device_guard(input.device());
    at::Tensor out = at::empty({destinations, block_bytes(rows, padded_chunk)}, input.options().dtype(at::kByte));
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
                                      c10::cuda::getCurrentCUDAStream());
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
    check_qgz_geometry(rows, padded_chunk);
    const int sources = check_qgz_blocks(blocks, rows, padded_chunk);
    check_qgz_error(error, blocks.device(), rows * padded_chunk);
    const c10::cuda::CUDAGuard device_guard(blocks.device());
    at::Tensor out = at::empty({rows, block_bytes(1, padded_chunk)}, blocks.options());
    dszpp::launch_qgz_reduce_encode_feedback(blocks.data_ptr<uint8_t>(),
                                             sources,
                                             static_cast<int>(rows),
                                             padded_chunk,
                                             error.data_ptr<float>(),
                                             static_cast<float>(beta),
                                             static_cast<float>(keep),
                                             out.data_ptr<uint8_t>(),
                                             c10::cuda::getCurrentCUDAStream());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}

// Writes into `out` (allocated by the caller in the gradient's dtype, numel <= padded_chunk).
void qgz_decode_sum(const at::Tensor& blocks, int64_t padded_chunk, double factor, at::Tensor& out)
{
    check_qgz_geometry(1, padded_chunk);
    const int sources = check_qgz_blocks(blocks, 1, padded_chunk);
    check_flat_cuda(out, "out");
    require(out.device() == blocks.device(), "out and blocks on different devices");
    require(out.numel() <= padded_chunk, "out has more elements than a chunk");
    const dszpp::Format format = format_of(out.scalar_type(), "out");
    const c10::cuda::CUDAGuard device_guard(blocks.device());
    dszpp::launch_qgz_decode_sum(format,
                                 blocks.data_ptr<uint8_t>(),
                                 sources,
                                 padded_chunk,
                                 static_cast<float>(factor),
                                 out.data_ptr(),
                                 out.numel(),
                                 c10::cuda::getCurrentCUDAStream());
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
