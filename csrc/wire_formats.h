// Constants of the wire formats (docs/numerics.md), once for the host bindings and the kernels; the Python side holds
// the same values in deepspeed_zeropp/formats/. Host-safe: no CUDA or torch headers, so binding.cpp can include it.
#pragma once

#include <cstdint>

namespace dszpp {
namespace int4 {  // qgZ's 4-bit gradient wire (deepspeed_zeropp/formats/int4.py)

constexpr int kGroup = 256;             // values per group (even: two codes per byte)
constexpr int kLevels = 7;              // codes in [-7, 7]: symmetric, so rounding is unbiased
constexpr float kStep = 1.f / kLevels;  // 1/7 correctly rounded; 7 * kStep rounds to exactly 1
constexpr float kMinScale = 0x1p-125f;  // smallest scale: kLevels / kMinScale < FLT_MAX
constexpr int64_t kScaleBytes = 4;      // one fp32 scale per group, after a block's codes

// A block of `rows` rows of `padded_chunk` values (a multiple of kGroup): packed codes, then the groups' scales.
constexpr int64_t codes_bytes(int64_t rows, int64_t padded_chunk) { return rows * padded_chunk / 2; }
constexpr int64_t block_bytes(int64_t rows, int64_t padded_chunk)
{
    return codes_bytes(rows, padded_chunk) + rows * (padded_chunk / kGroup) * kScaleBytes;
}

}  // namespace int4
}  // namespace dszpp
