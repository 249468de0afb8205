// Host-side entry points of the native symmetric int8 quantizer (wire format: DESIGN.md "Wire format").
//
// Kept free of torch headers so that the kernels compile in seconds; binding.cpp does the tensor checks
// and calls these with raw pointers on the caller's current stream.
#pragma once

#include <cuda_runtime.h>
#include <cstdint>

namespace dszpp {

enum class Format { kHalf, kBFloat16, kFloat };

// One block per contiguous group of `group_size` elements; writes `groups` codes blocks and fp32 scales.
void launch_quantize(Format format,
                     const void* input,
                     int8_t* codes,
                     float* scales,
                     int64_t groups,
                     int64_t group_size,
                     cudaStream_t stream);

// out[i] = codes[i] * scales[i / group_size], for i < numel (numel may be a prefix of groups * group_size).
void launch_dequantize(Format format,
                       const int8_t* codes,
                       const float* scales,
                       void* out,
                       int64_t numel,
                       int64_t group_size,
                       cudaStream_t stream);

}  // namespace dszpp
