// Symmetric int8 dequantization: out[i] = codes[i] * scales[i / group_size], rounded once to the output format.
//
// Each thread turns one 16-byte packet of codes into 16 outputs written as 16-byte stores. Groups of any size
// are handled inside the packet by stepping the group index when the offset reaches group_size (no per-element
// division). The last, partial packet and pointers that are not 16-byte aligned go element by element.
#include "formats.cuh"
#include "quantizer.h"

namespace dszpp {
namespace {

constexpr int kThreads = 256;

template <typename Fmt, int VEC>
__global__ void __launch_bounds__(kThreads) dequantize_kernel(const int8_t* __restrict__ codes,
                                  const float* __restrict__ scales,
                                  typename Fmt::Bits* __restrict__ out,
                                  int64_t numel,
                                  int64_t group_size)
{
    using Bits = typename Fmt::Bits;
    const int64_t first = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * VEC;
    if (first >= numel) return;
    int64_t group = first / group_size;
    int64_t offset = first - group * group_size;
    float scale = __ldg(scales + group);
    auto value = [&](int8_t code) {
        if (offset == group_size) {
            offset = 0;
            scale = __ldg(scales + ++group);
        }
        ++offset;
        return Fmt::from_float(__fmul_rn(static_cast<float>(code), scale));
    };

    if (first + VEC <= numel) {
        PacketOf<int8_t, VEC> in;
        in.raw[0] = reinterpret_cast<const PacketOf<int8_t, VEC>*>(codes + first)->raw[0];
        PacketOf<Bits, VEC> result;
#pragma unroll
        for (int j = 0; j < VEC; ++j) result.e[j] = value(in.e[j]);
        auto* dst = reinterpret_cast<PacketOf<Bits, VEC>*>(out + first);
#pragma unroll
        for (int r = 0; r < sizeof(result.raw) / sizeof(result.raw[0]); ++r) dst->raw[r] = result.raw[r];
    } else {
        for (int64_t i = first; i < numel; ++i) out[i] = value(codes[i]);
    }
}

template <typename Fmt>
void launch(const int8_t* codes, const float* scales, void* out, int64_t numel, int64_t group_size, cudaStream_t stream)
{
    using Bits = typename Fmt::Bits;
    constexpr int kVec = 16;
    if (numel == 0) return;
    const bool aligned = reinterpret_cast<uintptr_t>(codes) % 16 == 0 && reinterpret_cast<uintptr_t>(out) % 16 == 0;
    const int64_t packets = aligned ? (numel + kVec - 1) / kVec : numel;
    const int64_t blocks = (packets + kThreads - 1) / kThreads;
    Bits* bits = static_cast<Bits*>(out);
    if (aligned)
        dequantize_kernel<Fmt, kVec><<<blocks, kThreads, 0, stream>>>(codes, scales, bits, numel, group_size);
    else
        dequantize_kernel<Fmt, 1><<<blocks, kThreads, 0, stream>>>(codes, scales, bits, numel, group_size);
}

}  // namespace

void launch_dequantize(Format format,
                       const int8_t* codes,
                       const float* scales,
                       void* out,
                       int64_t numel,
                       int64_t group_size,
                       cudaStream_t stream)
{
    switch (format) {
        case Format::kHalf: launch<HalfFormat>(codes, scales, out, numel, group_size, stream); break;
        case Format::kBFloat16: launch<BFloat16Format>(codes, scales, out, numel, group_size, stream); break;
        case Format::kFloat: launch<FloatFormat>(codes, scales, out, numel, group_size, stream); break;
    }
}

}  // namespace dszpp
