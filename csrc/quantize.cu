// Symmetric int8 quantization, one thread block per contiguous group.
//
// A block reads its group once into registers (up to kCachedLoads 16-byte loads per thread, i.e. 64 KiB per
// group at 1024 threads, four times DeepSpeed's largest group), reduces the exact absmax, then writes the codes
// from registers: input bytes cross the memory bus once. Larger groups (a prime-sized tensor is one group) take
// a second pass over the input, which then mostly hits L2. Whatever the group size, the aligned interior of a
// group moves in 16-byte loads; the few elements before the first and after the last 16-byte boundary of the
// group are handled one at a time. An input pointer that is not 16-byte aligned runs the same kernel with
// single-element packets.
#include <cfloat>
#include <cmath>

#include "formats.cuh"
#include "quantizer.h"

namespace dszpp {
namespace {

constexpr int kCachedLoads = 4;
constexpr int kMaxThreads = 1024;
constexpr int kMinThreads = 32;

__device__ __forceinline__ uint32_t warp_max(uint32_t v)
{
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, offset));
    return v;
}

// Every thread returns the block's maximum; one barrier.
__device__ __forceinline__ uint32_t block_max(uint32_t v)
{
    __shared__ uint32_t warp_results[kMaxThreads / 32];
    const int lane = threadIdx.x % 32;
    const int warp = threadIdx.x / 32;
    v = warp_max(v);
    if (lane == 0) warp_results[warp] = v;
    __syncthreads();
    const int warps = blockDim.x / 32;
    return warp_max(lane < warps ? warp_results[lane] : 0u);
}

template <typename Fmt>
__device__ __forceinline__ int8_t quantize_one(uint32_t bits, float multiplier, bool finite)
{
    // __fmul_rn: one IEEE rounding, never fused into anything else; the rounding to int is half-to-even.
    const int code = __float2int_rn(__fmul_rn(Fmt::to_float(bits), multiplier));
    return finite ? static_cast<int8_t>(min(max(code, -128), 127)) : int8_t(0);
}

template <typename Fmt, int VEC>
__global__ void __launch_bounds__(kMaxThreads) quantize_kernel(const typename Fmt::Bits* __restrict__ input,
                                int8_t* __restrict__ codes,
                                float* __restrict__ scales,
                                int64_t group_size)
{
    using Bits = typename Fmt::Bits;
    using InPacket = PacketOf<Bits, VEC>;
    using CodePacket = PacketOf<int8_t, VEC>;

    const int64_t start = static_cast<int64_t>(blockIdx.x) * group_size;
    const int64_t end = start + group_size;
    const int64_t body_start = min((start + VEC - 1) / VEC * VEC, end);
    const int64_t body_end = max(end / VEC * VEC, body_start);
    const int64_t packets = (body_end - body_start) / VEC;
    const int edge = static_cast<int>((body_start - start) + (end - body_end));  // < 2 * VEC <= blockDim.x
    const InPacket* body = reinterpret_cast<const InPacket*>(input + body_start);
    CodePacket* body_codes = reinterpret_cast<CodePacket*>(codes + body_start);

    const int64_t stride = static_cast<int64_t>(blockDim.x) * kCachedLoads;
    const bool cached = packets <= stride;
    InPacket cache[kCachedLoads];
    auto load = [&](int64_t base) {
#pragma unroll
        for (int k = 0; k < kCachedLoads; ++k) {
            const int64_t idx = base + threadIdx.x + k * blockDim.x;
#pragma unroll
            for (int r = 0; r < sizeof(cache[k].raw) / sizeof(cache[k].raw[0]); ++r)
                cache[k].raw[r] = idx < packets ? body[idx].raw[r] : typename InPacket::RawType{};
        }
    };

    uint32_t magnitude = 0;
    for (int64_t base = 0; base < packets; base += stride) {
        load(base);
#pragma unroll
        for (int k = 0; k < kCachedLoads; ++k)
#pragma unroll
            for (int j = 0; j < VEC; ++j) magnitude = max(magnitude, Fmt::magnitude(cache[k].e[j]));
    }
    const int64_t edge_index = threadIdx.x < (body_start - start) ? start + threadIdx.x
                                                                   : body_end + threadIdx.x - (body_start - start);
    const bool has_edge = threadIdx.x < edge;
    const Bits edge_bits = has_edge ? input[edge_index] : Bits(0);
    magnitude = max(magnitude, Fmt::magnitude(edge_bits));

    const float absmax = Fmt::to_float(block_max(magnitude));
    const bool finite = absmax <= FLT_MAX;  // false for inf and NaN
    // IEEE division: 128 / absmax of a subnormal absmax stays exact; capped so that tiny groups stay finite.
    const float multiplier = absmax == 0.f ? 1.f : fminf(__fdiv_rn(128.f, absmax), FLT_MAX);
    if (threadIdx.x == 0) scales[blockIdx.x] = finite ? __frcp_rn(multiplier) : NAN;

    for (int64_t base = 0; base < packets; base += stride) {
        if (!cached) load(base);
#pragma unroll
        for (int k = 0; k < kCachedLoads; ++k) {
            const int64_t idx = base + threadIdx.x + k * blockDim.x;
            if (idx < packets) {
                CodePacket out;
#pragma unroll
                for (int j = 0; j < VEC; ++j) out.e[j] = quantize_one<Fmt>(cache[k].e[j], multiplier, finite);
                body_codes[idx].raw[0] = out.raw[0];
            }
        }
    }
    if (has_edge) codes[edge_index] = quantize_one<Fmt>(edge_bits, multiplier, finite);
}

int next_pow2(int64_t n)
{
    int p = 1;
    while (p < n && p < kMaxThreads) p <<= 1;
    return p;
}

template <typename Fmt>
void launch(const void* input, int8_t* codes, float* scales, int64_t groups, int64_t group_size, cudaStream_t stream)
{
    using Bits = typename Fmt::Bits;
    constexpr int kVec = 16 / sizeof(Bits);
    const bool aligned = reinterpret_cast<uintptr_t>(input) % 16 == 0 && reinterpret_cast<uintptr_t>(codes) % 16 == 0;
    const int64_t packets = aligned ? (group_size + kVec - 1) / kVec : group_size;
    const int threads = max(kMinThreads, next_pow2((packets + kCachedLoads - 1) / kCachedLoads));
    const Bits* bits = static_cast<const Bits*>(input);
    if (aligned)
        quantize_kernel<Fmt, kVec><<<groups, threads, 0, stream>>>(bits, codes, scales, group_size);
    else
        quantize_kernel<Fmt, 1><<<groups, threads, 0, stream>>>(bits, codes, scales, group_size);
}

}  // namespace

void launch_quantize(Format format,
                     const void* input,
                     int8_t* codes,
                     float* scales,
                     int64_t groups,
                     int64_t group_size,
                     cudaStream_t stream)
{
    switch (format) {
        case Format::kHalf: launch<HalfFormat>(input, codes, scales, groups, group_size, stream); break;
        case Format::kBFloat16: launch<BFloat16Format>(input, codes, scales, groups, group_size, stream); break;
        case Format::kFloat: launch<FloatFormat>(input, codes, scales, groups, group_size, stream); break;
    }
}

}  // namespace dszpp
