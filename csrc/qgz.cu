// qgZ's 4-bit gradient codec (layout: deepspeed_zeropp/qgz_wire.py), one warp per group of 256 values.
//
// Each lane owns 8 consecutive values of its warp's group, which are exactly one 32-bit word of packed codes, so
// every code load and store is one coalesced word per lane, and the group's absmax is a warp shuffle reduction: no
// shared memory, no block barrier. The three kernels are the three steps of the reduce-scatter:
//   encode         gradient (fp16/bf16/fp32) -> blocks of codes+scales, one per destination, in the swizzled order
//                  the all-to-all needs (the layout is computed from indices; the gradient is read once).
//   reduce_encode  received blocks -> fp32 sum over sources -> codes+scales again (the node-local partial sums).
//   decode_sum     received blocks -> fp32 sum over sources -> times factor -> gradient dtype.
// Arithmetic mirrors the torch reference operation for operation: __fmul_rn/__fadd_rn keep nvcc from contracting a
// multiply and an add into one FMA (one rounding instead of two), and sums run over sources in order.
#include <cfloat>
#include <cstdint>

#include "formats.cuh"
#include "quantizer.h"

namespace dszpp {
namespace {

constexpr int kGroup = 256;               // values per 4-bit group (qgz_wire.GROUP)
constexpr int kPerLane = kGroup / 32;     // 8 values = 8 nibbles = one 32-bit word per lane
constexpr int kWarps = 8;                 // warps (groups) per block
constexpr int kLevels = 8;                // codes in [-8, 7]

__device__ __forceinline__ uint32_t warp_max(uint32_t v)
{
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, offset));
    return v;
}

// Quantizes a lane's 8 fp32 values against the warp's absmax (found from magnitude bits: NaN > inf > finite, so the
// max keeps a NaN) and writes the lane's code word and, from lane 0, the group's scale.
__device__ __forceinline__ void quantize_group(const float (&values)[kPerLane],
                                               uint32_t* __restrict__ code_word,
                                               float* __restrict__ scale)
{
    uint32_t magnitude = 0;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) magnitude = max(magnitude, __float_as_uint(values[i]) & 0x7fffffffu);
    const float absmax = __uint_as_float(warp_max(magnitude));
    const bool finite = absmax <= FLT_MAX;
    // Correctly rounded 8 / absmax and 1 / multiplier (double, rounded once to float: exact for these quotients).
    const float multiplier = absmax == 0.f ? 1.f : fminf(static_cast<float>(8.0 / absmax), FLT_MAX);
    uint32_t word = 0;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
        const int code = finite ? min(max(__float2int_rn(__fmul_rn(values[i], multiplier)), -kLevels), kLevels - 1)
                                : 0;
        word |= (static_cast<uint32_t>(code) & 0xfu) << (4 * i);
    }
    *code_word = word;
    if (threadIdx.x % 32 == 0) *scale = finite ? static_cast<float>(1.0 / multiplier) : NAN;
}

// acc[i] = sum over sources s (in order) of code_s[i] * scale_s, every product and sum rounded to fp32.
__device__ __forceinline__ void dequantize_sum(const uint8_t* __restrict__ blocks,
                                               int64_t block_bytes,
                                               int sources,
                                               int64_t word_offset,
                                               int64_t scale_offset,
                                               float (&acc)[kPerLane])
{
    for (int s = 0; s < sources; ++s) {
        const uint8_t* block = blocks + s * block_bytes;
        const uint32_t word = *reinterpret_cast<const uint32_t*>(block + word_offset);
        const float scale = *reinterpret_cast<const float*>(block + scale_offset);
#pragma unroll
        for (int i = 0; i < kPerLane; ++i) {
            const int code = static_cast<int32_t>(word << (28 - 4 * i)) >> 28;  // sign-extends nibble i
            const float value = __fmul_rn(static_cast<float>(code), scale);
            acc[i] = s == 0 ? value : __fadd_rn(acc[i], value);
        }
    }
}

struct Warp {
    int64_t index;  // global group index
    int lane;
};

__device__ __forceinline__ Warp this_warp()
{
    return {static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32, static_cast<int>(threadIdx.x % 32)};
}

template <typename Fmt>
__global__ void __launch_bounds__(kWarps * 32) encode_kernel(const typename Fmt::Bits* __restrict__ input,
                                                             int64_t numel,
                                                             int64_t chunk,
                                                             int64_t padded_chunk,
                                                             int destinations,
                                                             int rows,
                                                             uint8_t* __restrict__ out,
                                                             int64_t block_bytes,
                                                             int64_t total_groups)
{
    using Bits = typename Fmt::Bits;
    using InPacket = PacketOf<Bits, kPerLane>;
    const Warp warp = this_warp();
    if (warp.index >= total_groups) return;
    const int64_t groups_per_row = padded_chunk / kGroup;
    const int64_t row_index = warp.index / groups_per_row;
    const int64_t group = warp.index - row_index * groups_per_row;
    const int destination = static_cast<int>(row_index / rows);
    const int row = static_cast<int>(row_index - static_cast<int64_t>(destination) * rows);
    const int64_t source_chunk = static_cast<int64_t>(row) * destinations + destination;
    const int64_t column = group * kGroup + warp.lane * kPerLane;  // within the chunk
    const int64_t first = source_chunk * chunk + column;            // within the gradient

    float values[kPerLane];
    const Bits* at = input + first;
    if (column + kPerLane <= chunk && first + kPerLane <= numel && reinterpret_cast<uintptr_t>(at) % 16 == 0) {
        InPacket packet;
#pragma unroll
        for (int r = 0; r < sizeof(packet.raw) / sizeof(packet.raw[0]); ++r)
            packet.raw[r] = reinterpret_cast<const InPacket*>(at)->raw[r];
#pragma unroll
        for (int i = 0; i < kPerLane; ++i) values[i] = Fmt::to_float(packet.e[i]);
    } else {  // the chunk's padding, the gradient's end, or a start that is not 16-byte aligned
#pragma unroll
        for (int i = 0; i < kPerLane; ++i)
            values[i] = column + i < chunk && first + i < numel ? Fmt::to_float(at[i]) : 0.f;
    }
    uint8_t* block = out + destination * block_bytes;
    const int64_t row_group = static_cast<int64_t>(row) * groups_per_row + group;
    quantize_group(values,
                   reinterpret_cast<uint32_t*>(block + row_group * (kGroup / 2)) + warp.lane,
                   reinterpret_cast<float*>(block + rows * padded_chunk / 2) + row_group);
}

__global__ void __launch_bounds__(kWarps * 32) reduce_encode_kernel(const uint8_t* __restrict__ in,
                                                                    int sources,
                                                                    int rows,
                                                                    int64_t padded_chunk,
                                                                    uint8_t* __restrict__ out,
                                                                    int64_t total_groups)
{
    const Warp warp = this_warp();
    if (warp.index >= total_groups) return;
    const int64_t groups_per_row = padded_chunk / kGroup;
    const int64_t row = warp.index / groups_per_row;
    const int64_t group = warp.index - row * groups_per_row;
    const int64_t in_codes = rows * padded_chunk / 2;
    const int64_t in_block = in_codes + rows * groups_per_row * 4;
    float acc[kPerLane];
    dequantize_sum(in, in_block, sources, warp.index * (kGroup / 2) + warp.lane * 4, in_codes + warp.index * 4, acc);
    uint8_t* block = out + row * (padded_chunk / 2 + groups_per_row * 4);
    quantize_group(acc,
                   reinterpret_cast<uint32_t*>(block + group * (kGroup / 2)) + warp.lane,
                   reinterpret_cast<float*>(block + padded_chunk / 2) + group);
}

template <typename Fmt>
__global__ void __launch_bounds__(kWarps * 32) decode_sum_kernel(const uint8_t* __restrict__ in,
                                                                 int sources,
                                                                 int64_t padded_chunk,
                                                                 float factor,
                                                                 typename Fmt::Bits* __restrict__ out,
                                                                 int64_t count)
{
    using Bits = typename Fmt::Bits;
    using OutPacket = PacketOf<Bits, kPerLane>;
    const Warp warp = this_warp();
    const int64_t first = warp.index * kGroup + warp.lane * kPerLane;
    if (first >= count) return;  // whole lanes past the end: loads skipped as well
    const int64_t codes = padded_chunk / 2;
    float acc[kPerLane];
    dequantize_sum(in, codes + padded_chunk / kGroup * 4, sources, first / 2, codes + warp.index * 4, acc);
    Bits* at = out + first;
    if (first + kPerLane <= count && reinterpret_cast<uintptr_t>(at) % 16 == 0) {
        OutPacket packet;
#pragma unroll
        for (int i = 0; i < kPerLane; ++i) packet.e[i] = Fmt::from_float(__fmul_rn(acc[i], factor));
#pragma unroll
        for (int r = 0; r < sizeof(packet.raw) / sizeof(packet.raw[0]); ++r)
            reinterpret_cast<OutPacket*>(at)->raw[r] = packet.raw[r];
    } else {
#pragma unroll
        for (int i = 0; i < kPerLane; ++i)
            if (first + i < count) at[i] = Fmt::from_float(__fmul_rn(acc[i], factor));
    }
}

int64_t blocks_for(int64_t groups) { return (groups + kWarps - 1) / kWarps; }

template <typename Fmt>
void encode(const void* input,
            int64_t numel,
            int64_t chunk,
            int64_t padded_chunk,
            int destinations,
            int rows,
            uint8_t* out,
            cudaStream_t stream)
{
    const int64_t groups = static_cast<int64_t>(destinations) * rows * (padded_chunk / kGroup);
    const int64_t block_bytes = rows * padded_chunk / 2 + rows * (padded_chunk / kGroup) * 4;
    if (groups == 0) return;
    encode_kernel<Fmt><<<blocks_for(groups), kWarps * 32, 0, stream>>>(static_cast<const typename Fmt::Bits*>(input),
                                                                        numel,
                                                                        chunk,
                                                                        padded_chunk,
                                                                        destinations,
                                                                        rows,
                                                                        out,
                                                                        block_bytes,
                                                                        groups);
}

template <typename Fmt>
void decode_sum(const uint8_t* in, int sources, int64_t padded_chunk, float factor, void* out, int64_t count,
                cudaStream_t stream)
{
    if (count == 0) return;
    decode_sum_kernel<Fmt><<<blocks_for((count + kGroup - 1) / kGroup), kWarps * 32, 0, stream>>>(
        in, sources, padded_chunk, factor, static_cast<typename Fmt::Bits*>(out), count);
}

}  // namespace

void launch_qgz_encode(Format format,
                       const void* input,
                       int64_t numel,
                       int64_t chunk,
                       int64_t padded_chunk,
                       int destinations,
                       int rows,
                       uint8_t* out,
                       cudaStream_t stream)
{
    switch (format) {
        case Format::kHalf:
            encode<HalfFormat>(input, numel, chunk, padded_chunk, destinations, rows, out, stream);
            break;
        case Format::kBFloat16:
            encode<BFloat16Format>(input, numel, chunk, padded_chunk, destinations, rows, out, stream);
            break;
        case Format::kFloat:
            encode<FloatFormat>(input, numel, chunk, padded_chunk, destinations, rows, out, stream);
            break;
    }
}

void launch_qgz_reduce_encode(const uint8_t* in,
                              int sources,
                              int rows,
                              int64_t padded_chunk,
                              uint8_t* out,
                              cudaStream_t stream)
{
    const int64_t groups = rows * (padded_chunk / kGroup);
    if (groups == 0) return;
    reduce_encode_kernel<<<blocks_for(groups), kWarps * 32, 0, stream>>>(in, sources, rows, padded_chunk, out, groups);
}

void launch_qgz_decode_sum(Format format,
                           const uint8_t* in,
                           int sources,
                           int64_t padded_chunk,
                           float factor,
                           void* out,
                           int64_t count,
                           cudaStream_t stream)
{
    switch (format) {
        case Format::kHalf: decode_sum<HalfFormat>(in, sources, padded_chunk, factor, out, count, stream); break;
        case Format::kBFloat16:
            decode_sum<BFloat16Format>(in, sources, padded_chunk, factor, out, count, stream);
            break;
        case Format::kFloat: decode_sum<FloatFormat>(in, sources, padded_chunk, factor, out, count, stream); break;
    }
}

}  // namespace dszpp
