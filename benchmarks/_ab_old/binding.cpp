// Python binding of the native quantizer: tensor checks, output allocation, device guard and current stream.
//
// Only the light ATen/pybind headers are included (not torch/extension.h) to keep the cold JIT build short.
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAStream.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/csrc/utils/pybind.h>

#include <tuple>

#include "quantizer.h"

namespace {

dszpp::Format format_of(at::ScalarType type, const char* what)
{
    switch (type) {
        case at::kHalf: return dszpp::Format::kHalf;
        case at::kBFloat16: return dszpp::Format::kBFloat16;
        case at::kFloat: return dszpp::Format::kFloat;
        default: TORCH_CHECK(false, what, " must be float16, bfloat16 or float32, got ", type);
    }
}

void check_flat_cuda(const at::Tensor& t, const char* what)
{
    TORCH_CHECK(t.is_cuda(), what, " must be a CUDA tensor");
    TORCH_CHECK(t.dim() == 1 && t.is_contiguous(), what, " must be flat and contiguous");
}

std::tuple<at::Tensor, at::Tensor> quantize(const at::Tensor& input, int64_t groups)
{
    check_flat_cuda(input, "input");
    const dszpp::Format format = format_of(input.scalar_type(), "input");
    TORCH_CHECK(groups >= 1 && input.numel() % groups == 0, "groups must be >= 1 and divide numel");
    TORCH_CHECK(groups <= INT32_MAX, "at most 2^31 - 1 groups are supported");
    TORCH_CHECK(input.numel() / groups < INT32_MAX - 64, "groups of 2^31 or more elements are not supported");
    const c10::cuda::CUDAGuard device_guard(input.device());
    at::Tensor codes = at::empty({input.numel()}, input.options().dtype(at::kChar));
    at::Tensor scales = at::empty({groups}, input.options().dtype(at::kFloat));
    dszpp::launch_quantize(format,
                           input.data_ptr(),
                           codes.data_ptr<int8_t>(),
                           scales.data_ptr<float>(),
                           groups,
                           input.numel() / groups,
                           c10::cuda::getCurrentCUDAStream());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return {codes, scales};
}

// Writes into `out` (allocated by the caller in the requested dtype) rather than taking a dtype argument.
void dequantize(const at::Tensor& codes, const at::Tensor& scales, int64_t group_size, at::Tensor& out)
{
    check_flat_cuda(codes, "codes");
    check_flat_cuda(scales, "scales");
    check_flat_cuda(out, "out");
    TORCH_CHECK(codes.scalar_type() == at::kChar, "codes must be int8");
    TORCH_CHECK(scales.scalar_type() == at::kFloat, "scales must be float32");
    TORCH_CHECK(out.numel() == codes.numel(), "out must have as many elements as codes");
    TORCH_CHECK(codes.device() == scales.device() && codes.device() == out.device(), "tensors on different devices");
    TORCH_CHECK(group_size >= 1 && codes.numel() <= scales.numel() * group_size,
                "codes do not fit the given groups and group_size");
    const dszpp::Format format = format_of(out.scalar_type(), "out");
    const c10::cuda::CUDAGuard device_guard(codes.device());
    dszpp::launch_dequantize(format,
                             codes.data_ptr<int8_t>(),
                             scales.data_ptr<float>(),
                             out.data_ptr(),
                             codes.numel(),
                             group_size,
                             c10::cuda::getCurrentCUDAStream());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m)
{
    m.doc() = "deepspeed_zeropp native symmetric int8 quantizer (fp16, bf16, fp32)";
    m.def("quantize", &quantize, "flat input, groups -> (int8 codes, fp32 scales [groups])");
    m.def("dequantize", &dequantize, "codes, scales, group_size, out: out[i] = codes[i] * scales[i / group_size]");
}
