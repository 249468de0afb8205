// Python binding of the native quantizer: tensor checks, output allocation, device guard and current stream.
//
// Only the light ATen/pybind headers are included (not torch/extension.h) to keep the cold JIT build short.
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAStream.h>
#include <ATen/ops/empty.h>
#include <ATen/EmptyTensor.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/csrc/utils/pybind.h>

#include <cstdint>
#include <optional>
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

// The int8 entry points read any contiguous tensor as flat and give their results its shape.
void check_contiguous_cuda(const at::Tensor& t, const char* what)
{
    require(t.is_cuda(), what, " must be a CUDA tensor");
    require(t.is_contiguous(), what, " must be contiguous");
}

// The int8 outputs come straight from the CUDA caching allocator instead of through the operator dispatcher
// (at::empty) or at::detail::empty_cuda (which sets and restores the device around it): the same tensor for a
// fraction of a microsecond less, on a path ZeRO-3 takes for every gathered parameter or bucket. The allocator serves
// the current device, which OnDevice has made the input's.
at::Tensor empty_on(at::IntArrayRef sizes, at::ScalarType type)
{
    return at::Tensor(at::detail::empty_generic(
        sizes, c10::cuda::CUDACachingAllocator::get(), c10::DispatchKeySet(c10::DispatchKey::CUDA), type, std::nullopt));
}

// Makes the tensor's device current for the allocation and the launch. ZeRO-3 calls with tensors on the current
// device, so the guard (which restores the previous device afterwards) is only built when they differ.
class OnDevice {
public:
    explicit OnDevice(const at::Tensor& tensor) : index_(tensor.device().index())
    {
        if (c10::cuda::current_device() != index_) guard_.emplace(tensor.device());
    }
    cudaStream_t stream() const { return c10::cuda::getCurrentCUDAStream(index_); }

private:
    c10::DeviceIndex index_;
    std::optional<c10::cuda::CUDAGuard> guard_;
};

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

// Allocation and launch for inputs already checked, on the input's device and current stream.
std::tuple<at::Tensor, at::Tensor> run_quantize(const at::Tensor& input,
                                                dszpp::Format format,
                                                int64_t groups,
                                                int64_t group_size)
{
    const OnDevice device(input);
    at::Tensor codes = empty_on(input.sizes(), at::kChar);
    at::Tensor scales = empty_on({groups}, at::kFloat);
    launch_quantize_into(device, input, format, groups, group_size, codes.data_ptr<int8_t>(), scales.data_ptr<float>());
    return {codes, scales};
}

at::Tensor run_dequantize(const at::Tensor& codes,
                          const at::Tensor& scales,
                          int64_t group_size,
                          int64_t block_numel,
                          at::ScalarType out_type)
{
    const OnDevice device(codes);
    at::Tensor out = empty_on(codes.sizes(), out_type);
    dszpp::launch_dequantize(format_of(out_type, "out"),
                             codes.data_ptr<int8_t>(),
                             scales.data_ptr<float>(),
                             out.data_ptr(),
                             codes.numel(),
                             group_size,
                             block_numel,
                             device.stream());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
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
    return run_quantize(input, format, groups, group_size);
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
    return run_dequantize(codes, scales, group_size, block_numel, scalar_type_of(format_id));
}

// quantize() writing into the caller's `codes` (int8, input's numel) and `scales` (fp32, `groups`): views of a
// packet buffer, so that codes and scales leave in one all-gather without a copy.
void quantize_into(
    const at::Tensor& input, int64_t groups, int64_t group_size, at::Tensor& codes, at::Tensor& scales)
{
    check_contiguous_cuda(input, "input");
    check_contiguous_cuda(codes, "codes");
    check_contiguous_cuda(scales, "scales");
    const dszpp::Format format = format_of(input.scalar_type(), "input");
    require(codes.scalar_type() == at::kChar && scales.scalar_type() == at::kFloat, "codes int8, scales float32");
    require(codes.device() == input.device() && scales.device() == input.device(), "tensors on different devices");
    const int64_t numel = input.numel();
    require(groups >= 1 && groups <= INT32_MAX && group_size >= 0 && group_size < INT32_MAX - 64,
            "groups must be in [1, 2^31) and group_size in [0, 2^31 - 64)");
    require(numel <= groups * group_size && (numel == 0 || (groups - 1) * group_size < numel),
            "groups of group_size elements must cover numel, the last one holding at least one element");
    require(codes.numel() == numel && scales.numel() == groups, "codes must hold numel values and scales groups");
    const OnDevice device(input);
    launch_quantize_into(device, input, format, groups, group_size, codes.data_ptr<int8_t>(), scales.data_ptr<float>());
}

// Per-rank rows read in place from a gathered buffer of packets: `codes` [k, n] int8 and `scales` [k, G] fp32,
// views with unit inner stride whose rows lie the same number of bytes apart. Returns a new [k, n] tensor.
at::Tensor dequantize_rows(const at::Tensor& codes, const at::Tensor& scales, int64_t group_size, int64_t format_id)
{
    require(codes.is_cuda() && codes.device() == scales.device(), "codes and scales must be on one CUDA device");
    require(codes.scalar_type() == at::kChar && scales.scalar_type() == at::kFloat, "codes int8, scales float32");
    require(codes.dim() == 2 && scales.dim() == 2 && codes.size(0) == scales.size(0), "codes [k, n], scales [k, G]");
    require(codes.stride(1) == 1 && scales.stride(1) == 1, "rows must be contiguous");
    const int64_t rows = codes.size(0), numel = codes.size(1);
    require(rows <= 65535, "at most 65535 rows");
    require(rows == 1 || codes.stride(0) == scales.stride(0) * 4, "codes and scales rows must lie equally far apart");
    require(group_size >= 1 && scales.size(1) == (numel + group_size - 1) / group_size,
            "scales must hold one value per group of group_size in a row");
    const at::ScalarType out_type = scalar_type_of(format_id);
    const OnDevice device(codes);
    at::Tensor out = empty_on({rows, numel}, out_type);
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

// ---- qgZ and LoCo ----
//
// These functions are reached only through backends/cuda.py, which checks every argument before it gets here (tensor
// kinds, dtypes, devices, geometry, sizes, alignment, and the int limits of the static_casts below): an exception
// thrown from this extension has crashed the interpreter with torch 2.11 and CUDA 13, so nothing here checks again.

using dszpp::int4::block_bytes;

at::Tensor qgz_encode(const at::Tensor& input, int64_t destinations, int64_t rows, int64_t chunk, int64_t padded_chunk)
{
    const dszpp::Format format = format_of(input.scalar_type(), "input");
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

// Blocks arrive from an all-to-all: [sources, block bytes].
at::Tensor qgz_reduce_encode(const at::Tensor& blocks, int64_t rows, int64_t padded_chunk)
{
    const c10::cuda::CUDAGuard device_guard(blocks.device());
    at::Tensor out = at::empty({rows, block_bytes(1, padded_chunk)}, blocks.options());
    dszpp::launch_qgz_reduce_encode(blocks.data_ptr<uint8_t>(),
                                    static_cast<int>(blocks.size(0)),
                                    static_cast<int>(rows),
                                    padded_chunk,
                                    out.data_ptr<uint8_t>(),
                                    c10::cuda::getCurrentCUDAStream());
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
    const dszpp::Format format = format_of(input.scalar_type(), "input");
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
    const c10::cuda::CUDAGuard device_guard(blocks.device());
    at::Tensor out = at::empty({rows, block_bytes(1, padded_chunk)}, blocks.options());
    dszpp::launch_qgz_reduce_encode_feedback(blocks.data_ptr<uint8_t>(),
                                             static_cast<int>(blocks.size(0)),
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
    const dszpp::Format format = format_of(out.scalar_type(), "out");
    const c10::cuda::CUDAGuard device_guard(blocks.device());
    dszpp::launch_qgz_decode_sum(format,
                                 blocks.data_ptr<uint8_t>(),
                                 static_cast<int>(blocks.size(0)),
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
    m.def("quantize_into", &quantize_into, "input, groups, group_size, codes, scales: quantize into given views");
    m.def("dequantize_rows",
          &dequantize_rows,
          "codes [k, n], scales [k, G] (rows apart), group_size, format id -> [k, n] values");
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
