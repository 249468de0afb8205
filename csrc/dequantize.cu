// Symmetric int8 dequantization: out[i] = codes[i] * scales[group of i], rounded once to the output format.
//
// Each thread writes UNROLL 16-byte packets of output (8 fp16/bf16 or 4 fp32 values), strided by the block size so
// that every warp-wide load and store is contiguous; all code loads are issued before the first store. Equal groups of
// a multiple of the packet size (DeepSpeed's groups, and ours) put each packet in one group: one division and one
// scale per packet. Groups of any other size are handled inside a packet by stepping the group index when the offset
// reaches the group's length (one integer division per packet, two for blocked layouts). Divisions are 32-bit
// whenever the tensor allows. The last, partial packet and pointers that are not 16-byte aligned go element by element.
// Packets are read and written with cache-streaming hints (formats.cuh).
//
// Layouts (quantizer.h): equal groups, or blocks of block_numel elements each ending in a shorter group (a gather of
// per-rank quantized buffers). Groups are numbered block after block, so stepping always moves to the next scale; only
// a blocked layout has to track where in its block a group lies, to know the group's length. Equal groups compile to
// the kernel without that bookkeeping.
#include "formats.cuh"
#include "quantizer.h"

namespace dszpp {
namespace {

constexpr int kThreads = 256;  // with kUnroll 4: measured ahead of 128 x 8, 512 x 4 and 512 x 8 at 16M and 134M
constexpr int kUnroll = 4;

template <typename Index>
__device__ __forceinline__ Index smaller(Index a, Index b)
{
    return a < b ? a : b;
}

// kWhole: every packet lies in one group (equal groups of a multiple of VEC elements), so a packet takes one scale.
template <typename Fmt, int VEC, typename Index, bool kBlocked, bool kWhole>
__global__ void __launch_bounds__(kThreads) dequantize_kernel(const int8_t* __restrict__ codes,
                                                              const float* __restrict__ scales,
                                                              typename Fmt::Bits* __restrict__ out,
                                                              Index numel,
                                                              Index group_size,
                                                              Index block_numel,
                                                              Index block_groups)
{
    using Bits = typename Fmt::Bits;
    using CodePacket = PacketOf<int8_t, VEC>;
    using OutPacket = PacketOf<Bits, VEC>;
    const Index tile = static_cast<Index>(blockIdx.x) * kThreads * kUnroll;

    CodePacket in[kUnroll];
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
        const Index first = (tile + k * kThreads + threadIdx.x) * VEC;
        if (first + VEC <= numel)
            in[k].raw[0] = load_streaming(&reinterpret_cast<const CodePacket*>(codes + first)->raw[0]);
    }
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
        const Index first = (tile + k * kThreads + threadIdx.x) * VEC;
        if (first >= numel) break;
        if constexpr (kWhole) {
            const float scale = __ldg(scales + first / group_size);
            if (first + VEC <= numel) {
                OutPacket result;
#pragma unroll
                for (int j = 0; j < VEC; ++j)
                    result.e[j] = Fmt::from_float(__fmul_rn(static_cast<float>(in[k].e[j]), scale));
                OutPacket* target = reinterpret_cast<OutPacket*>(out + first);
#pragma unroll
                for (int r = 0; r < sizeof(result.raw) / sizeof(result.raw[0]); ++r)
                    store_streaming(&target->raw[r], result.raw[r]);
            } else {
                for (Index i = first; i < numel; ++i)
                    out[i] = Fmt::from_float(__fmul_rn(static_cast<float>(codes[i]), scale));
            }
            continue;
        }
        Index group, offset, length = group_size, in_block = 0;
        if constexpr (kBlocked) {
            const Index block = first / block_numel;
            const Index rest = first - block * block_numel;
            in_block = rest / group_size;
            offset = rest - in_block * group_size;
            group = block * block_groups + in_block;
            length = smaller(group_size, block_numel - in_block * group_size);
        } else {
            group = first / group_size;
            offset = first - group * group_size;
        }
        float scale = __ldg(scales + group);
        auto value = [&](int8_t code) {
            if (offset == length) {
                offset = 0;
                scale = __ldg(scales + ++group);
                if constexpr (kBlocked) {
                    in_block = in_block + 1 == block_groups ? 0 : in_block + 1;
                    length = smaller(group_size, block_numel - in_block * group_size);
                }
            }
            ++offset;
            return Fmt::from_float(__fmul_rn(static_cast<float>(code), scale));
        };
        if (first + VEC <= numel) {
            OutPacket result;
#pragma unroll
            for (int j = 0; j < VEC; ++j) result.e[j] = value(in[k].e[j]);
            OutPacket* target = reinterpret_cast<OutPacket*>(out + first);
#pragma unroll
            for (int r = 0; r < sizeof(result.raw) / sizeof(result.raw[0]); ++r)
                store_streaming(&target->raw[r], result.raw[r]);
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
                 int64_t block_numel,
                 cudaStream_t stream)
{
    const int64_t packets = (numel + VEC - 1) / VEC;
    const int64_t blocks = (packets + kThreads * kUnroll - 1) / (kThreads * kUnroll);
    const int64_t block_groups = (block_numel + group_size - 1) / group_size;
    const auto n = static_cast<Index>(numel);
    const auto size = static_cast<Index>(group_size);
    if (block_numel % group_size == 0 && group_size % VEC == 0)
        dequantize_kernel<Fmt, VEC, Index, false, true>
            <<<blocks, kThreads, 0, stream>>>(codes, scales, out, n, size, 0, 0);
    else if (block_numel % group_size == 0)
        dequantize_kernel<Fmt, VEC, Index, false, false>
            <<<blocks, kThreads, 0, stream>>>(codes, scales, out, n, size, 0, 0);
    else
        dequantize_kernel<Fmt, VEC, Index, true, false><<<blocks, kThreads, 0, stream>>>(
            codes, scales, out, n, size, static_cast<Index>(block_numel), static_cast<Index>(block_groups));
}

template <typename Fmt>
void launch(const int8_t* codes,
            const float* scales,
            void* out,
            int64_t numel,
            int64_t group_size,
            int64_t block_numel,
            cudaStream_t stream)
{
    using Bits = typename Fmt::Bits;
    constexpr int kVec = 16 / sizeof(Bits);
    if (numel == 0) return;
    const bool aligned = reinterpret_cast<uintptr_t>(codes) % 16 == 0 && reinterpret_cast<uintptr_t>(out) % 16 == 0;
    // 32-bit indices (cheaper division) while neither packet index arithmetic nor the layout's sizes overflow them.
    const int64_t limit = int64_t(1) << 32;
    const bool narrow = numel + kThreads * kUnroll * kVec < limit && group_size < limit && block_numel < limit;
    Bits* bits = static_cast<Bits*>(out);
    if (aligned && narrow)
        launch_with<Fmt, kVec, uint32_t>(codes, scales, bits, numel, group_size, block_numel, stream);
    else if (aligned)
        launch_with<Fmt, kVec, uint64_t>(codes, scales, bits, numel, group_size, block_numel, stream);
    else
        launch_with<Fmt, 1, uint64_t>(codes, scales, bits, numel, group_size, block_numel, stream);
}

}  // namespace

void launch_dequantize(Format format,
                       const int8_t* codes,
                       const float* scales,
                       void* out,
                       int64_t numel,
                       int64_t group_size,
                       int64_t block_numel,
                       cudaStream_t stream)
{
    switch (format) {
        case Format::kHalf: launch<HalfFormat>(codes, scales, out, numel, group_size, block_numel, stream); break;
        case Format::kBFloat16:
            launch<BFloat16Format>(codes, scales, out, numel, group_size, block_numel, stream);
            break;
        case Format::kFloat: launch<FloatFormat>(codes, scales, out, numel, group_size, block_numel, stream); break;
    }
}

}  // namespace dszpp
