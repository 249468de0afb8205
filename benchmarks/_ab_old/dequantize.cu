// Symmetric int8 dequantization: out[i] = codes[i] * scales[i / group_size], rounded once to the output format.
//
// Each thread writes UNROLL 16-byte packets of output (8 fp16/bf16 or 4 fp32 values), strided by the block size so
// that every warp-wide load and store is contiguous; all code loads are issued before the first store. Groups of any
// size are handled inside a packet by stepping the group index when the offset reaches group_size, so there is one
// integer division per packet, done in 32 bits whenever the tensor allows. The last, partial packet and pointers
// that are not 16-byte aligned go element by element.
#include "formats.cuh"
#include "quantizer.h"

namespace dszpp {
namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 4;

template <typename Fmt, int VEC, typename Index>
__global__ void __launch_bounds__(kThreads) dequantize_kernel(const int8_t* __restrict__ codes,
                                                              const float* __restrict__ scales,
                                                              typename Fmt::Bits* __restrict__ out,
                                                              Index numel,
                                                              Index group_size)
{
    using Bits = typename Fmt::Bits;
    using CodePacket = PacketOf<int8_t, VEC>;
    using OutPacket = PacketOf<Bits, VEC>;
    const Index tile = static_cast<Index>(blockIdx.x) * kThreads * kUnroll;

    CodePacket in[kUnroll];
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
        const Index first = (tile + k * kThreads + threadIdx.x) * VEC;
        if (first + VEC <= numel) in[k].raw[0] = reinterpret_cast<const CodePacket*>(codes + first)->raw[0];
    }
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
        const Index first = (tile + k * kThreads + threadIdx.x) * VEC;
        if (first >= numel) break;
        Index group = first / group_size;
        Index offset = first - group * group_size;
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
            OutPacket result;
#pragma unroll
            for (int j = 0; j < VEC; ++j) result.e[j] = value(in[k].e[j]);
            reinterpret_cast<OutPacket*>(out + first)->raw[0] = result.raw[0];
        } else {
            for (Index i = first; i < numel; ++i) out[i] = value(codes[i]);
        }
    }
}

template <typename Fmt, int VEC, typename Index>
void launch_with(const int8_t* codes,
                 const float* scales,
                 typename Fmt::Bits* out,
                 int64_t numel,
                 int64_t group_size,
                 cudaStream_t stream)
{
    const int64_t packets = (numel + VEC - 1) / VEC;
    const int64_t blocks = (packets + kThreads * kUnroll - 1) / (kThreads * kUnroll);
    dequantize_kernel<Fmt, VEC, Index><<<blocks, kThreads, 0, stream>>>(
        codes, scales, out, static_cast<Index>(numel), static_cast<Index>(group_size));
}

template <typename Fmt>
void launch(const int8_t* codes, const float* scales, void* out, int64_t numel, int64_t group_size, cudaStream_t stream)
{
    using Bits = typename Fmt::Bits;
    constexpr int kVec = 16 / sizeof(Bits);
    if (numel == 0) return;
    const bool aligned = reinterpret_cast<uintptr_t>(codes) % 16 == 0 && reinterpret_cast<uintptr_t>(out) % 16 == 0;
    // 32-bit indices (cheaper division) while the packet index arithmetic cannot overflow them.
    const bool narrow = numel + kThreads * kUnroll * kVec < (int64_t(1) << 32);
    Bits* bits = static_cast<Bits*>(out);
    if (aligned && narrow)
        launch_with<Fmt, kVec, uint32_t>(codes, scales, bits, numel, group_size, stream);
    else if (aligned)
        launch_with<Fmt, kVec, uint64_t>(codes, scales, bits, numel, group_size, stream);
    else
        launch_with<Fmt, 1, uint64_t>(codes, scales, bits, numel, group_size, stream);
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
