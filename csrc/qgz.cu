// qgZ's 4-bit gradient codec (wire: docs/numerics.md, constants: wire_formats.h), one warp per group of 256 values.
//
// Each lane owns 8 consecutive values of its warp's group, which are exactly one 32-bit word of packed codes, so
// every code load and store is one coalesced word per lane, and the group's absmax is a warp shuffle reduction: no
// shared memory, no block barrier. Loads are batched (several groups, or several sources, per warp) so that enough
// bytes are in flight to approach memory bandwidth. The three kernels are the three steps of the reduce-scatter:
//   encode         gradient (fp16/bf16/fp32) -> blocks of codes+scales, one per destination, in the swizzled order
//                  the all-to-all needs (the layout is computed from indices; the gradient is read once).
//   reduce_encode  received blocks -> fp32 sum over sources -> codes+scales again (the node-local partial sums).
//   decode_sum     received blocks -> fp32 sum over sources -> times factor -> gradient dtype.
// Results equal the torch reference bit for bit: the same products and sums in the same order (__fmul_rn/__fadd_rn keep
// nvcc from contracting a multiply and an add into one FMA), and codes rounded by another method to the same values
// (see quantize_groups).
#include <cfloat>
#include <cstdint>

#include "formats.cuh"
#include "quantizer.h"
#include "wire_formats.h"

namespace dszpp {
namespace {

using int4::kGroup;
using int4::kLevels;
using int4::kMinScale;
using int4::kStep;
constexpr int kPerLane = kGroup / 32;     // 8 values = 8 nibbles = one 32-bit word per lane
constexpr int kWarps = 8;                 // warps (groups) per block
// Encode asks for >= 6 resident blocks per SM (<= 40 registers per thread): at 4 blocks (32 warps), 16-bit encoding
// stalls on its loads with a third of the DRAM bandwidth in use.
constexpr int kEncodeBlocksPerSm = 6;

// max(a, b), NaN if either is NaN (fmaxf drops a NaN): one instruction from sm_80 on.
__device__ __forceinline__ float max_keeping_nan(float a, float b)
{
#if __CUDA_ARCH__ >= 800
    float d;
    asm("max.NaN.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b));
    return d;
#else
    return a != a || b != b ? __int_as_float(0x7fffffff) : fmaxf(a, b);
#endif
}

// Adding 1.5 * 2^23 rounds a float of magnitude < 2^22 to an integer, half to even (the add's own rounding), and
// leaves that integer in the low mantissa bits: code = bits - 0x4B400000, so its low nibble is the 4-bit code.
constexpr float kRoundingBias = 12582912.f;

// A lane's 8 values of one group as the raw 32-bit words they arrive in (4 words of 16-bit values, 8 of fp32), and
// value i of them widened to fp32. Keeping 16-bit values packed until use halves their registers.
template <typename Fmt>
constexpr int kWordsPerLane = kPerLane * static_cast<int>(sizeof(typename Fmt::Bits)) / 4;

template <typename Fmt>
__device__ __forceinline__ float lane_value(const uint32_t (&raw)[kWordsPerLane<Fmt>], int i)
{
    if constexpr (sizeof(typename Fmt::Bits) == 2)  // little-endian: the even element is the low half
        return Fmt::to_float(i % 2 == 0 ? raw[i / 2] & 0xffffu : raw[i / 2] >> 16);
    else
        return Fmt::to_float(raw[i]);
}

// Quantizes kGroups groups from a lane's raw words of each: returns the lane's code word and the group's scale per
// group. Instruction throughput, not memory, limited these kernels, so every per-value step is one FP32 instruction
// where it can be (absmax by a NaN-keeping float max of |value|; clamp to [-7, 7] before rounding, which equals
// clamping after it since rounding is monotonic and keeps the integer bounds; rounding by the bias add, whose low
// nibble is the code's 4-bit two's complement) and only the nibble packing uses the slower integer pipe. The
// groups' shuffle reductions are interleaved step by step, so their latencies overlap.
template <typename Fmt, int kGroups>
__device__ __forceinline__ void quantize_groups(const uint32_t (&raw)[kGroups][kWordsPerLane<Fmt>],
                                                uint32_t (&words)[kGroups],
                                                float (&scales)[kGroups])
{
    float absmax[kGroups];
#pragma unroll
    for (int k = 0; k < kGroups; ++k) {
        absmax[k] = 0.f;
#pragma unroll
        for (int i = 0; i < kPerLane; ++i) absmax[k] = max_keeping_nan(absmax[k], fabsf(lane_value<Fmt>(raw[k], i)));
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1)
#pragma unroll
        for (int k = 0; k < kGroups; ++k)
            absmax[k] = max_keeping_nan(absmax[k], __shfl_xor_sync(0xffffffffu, absmax[k], offset));
#pragma unroll
    for (int k = 0; k < kGroups; ++k) {
        const bool finite = absmax[k] <= FLT_MAX;  // false for inf and NaN
        const float scale = fmaxf(absmax[k], kMinScale);
        // IEEE (correctly rounded) 7 / scale, as torch divides tensors; no flush to zero.
        const float multiplier = __fdiv_rn(static_cast<float>(kLevels), scale);
        words[k] = 0;
#pragma unroll
        for (int i = 0; i < kPerLane; ++i) {
            const float scaled = __fmul_rn(lane_value<Fmt>(raw[k], i), multiplier);
            const float clamped = fminf(fmaxf(scaled, -kLevels), kLevels);
            const uint32_t biased = __float_as_uint(__fadd_rn(clamped, kRoundingBias));
            words[k] |= (biased & 0xfu) << (4 * i);
        }
        if (!finite) words[k] = 0;
        scales[k] = finite ? scale : NAN;
    }
}

// acc[i] = sum over sources s (in order) of (code_s[i] * kStep) * scale_s, every product and sum rounded to fp32:
// code +-7 decodes to exactly +-scale. Sources are read kSourceBatch at a time, all loads issued before the first sum.
constexpr int kSourceBatch = 4;

__device__ __forceinline__ void dequantize_sum(const uint8_t* __restrict__ blocks,
                                               int64_t block_bytes,
                                               int sources,
                                               int64_t word_offset,
                                               int64_t scale_offset,
                                               float (&acc)[kPerLane])
{
    for (int first = 0; first < sources; first += kSourceBatch) {
        uint32_t words[kSourceBatch];
        float scales[kSourceBatch];
#pragma unroll
        for (int b = 0; b < kSourceBatch; ++b) {
            if (first + b < sources) {
                const uint8_t* block = blocks + (first + b) * block_bytes;
                words[b] = *reinterpret_cast<const uint32_t*>(block + word_offset);
                scales[b] = *reinterpret_cast<const float*>(block + scale_offset);
            }
        }
#pragma unroll
        for (int b = 0; b < kSourceBatch; ++b) {
            if (first + b < sources) {
#pragma unroll
                for (int i = 0; i < kPerLane; ++i) {
                    const int code = static_cast<int32_t>(words[b] << (28 - 4 * i)) >> 28;  // sign-extends nibble i
                    const float value = __fmul_rn(__fmul_rn(static_cast<float>(code), kStep), scales[b]);
                    acc[i] = first + b == 0 ? value : __fadd_rn(acc[i], value);
                }
            }
        }
    }
}

// A lane's raw words from one 16-byte aligned address: one 16-byte load for 16-bit values, two for fp32.
template <typename Fmt>
__device__ __forceinline__ void load_lane(const typename Fmt::Bits* at, uint32_t (&raw)[kWordsPerLane<Fmt>])
{
    const uint4* vectors = reinterpret_cast<const uint4*>(at);
#pragma unroll
    for (int v = 0; v < kWordsPerLane<Fmt> / 4; ++v) {
        const uint4 loaded = vectors[v];
        raw[4 * v] = loaded.x;
        raw[4 * v + 1] = loaded.y;
        raw[4 * v + 2] = loaded.z;
        raw[4 * v + 3] = loaded.w;
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

// Each warp encodes kGroupsPerWarp consecutive groups (ordered by destination, row, group) in phases: every group's
// loads, then the interleaved reductions, then the stores. One group per warp at a time kept too few bytes in flight.
template <typename Fmt, int kGroupsPerWarp>
__global__ void __launch_bounds__(kWarps * 32, kEncodeBlocksPerSm)
    encode_kernel(const typename Fmt::Bits* __restrict__ input,
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
    const Warp warp = this_warp();
    // 32-bit index arithmetic (the host keeps group counts below 2^31): 64-bit divisions cost more instructions per
    // group than the quantization itself. The first group's place takes two divisions, the next ones a carry.
    const uint32_t groups_per_row = static_cast<uint32_t>(padded_chunk / kGroup);
    const uint32_t first_index = static_cast<uint32_t>(warp.index) * kGroupsPerWarp;
    uint32_t row_index = first_index / groups_per_row;
    uint32_t group = first_index - row_index * groups_per_row;
    uint32_t destination = row_index / rows;
    uint32_t row = row_index - destination * rows;
    uint32_t raw[kGroupsPerWarp][kWordsPerLane<Fmt>];
    bool valid[kGroupsPerWarp];
    uint32_t destinations_of[kGroupsPerWarp], row_groups[kGroupsPerWarp];  // where each group's codes go
#pragma unroll
    for (int k = 0; k < kGroupsPerWarp; ++k) {
        if (k > 0 && ++group == groups_per_row) {
            group = 0;
            if (++row == static_cast<uint32_t>(rows)) {
                row = 0;
                ++destination;
            }
        }
        valid[k] = first_index + k < total_groups;  // warp-uniform
        const int64_t column = static_cast<int64_t>(group) * kGroup + warp.lane * kPerLane;      // within the chunk
        const int64_t first = (static_cast<int64_t>(row) * destinations + destination) * chunk + column;  // gradient
        const Bits* at = input + first;
        if (valid[k] && column + kPerLane <= chunk && first + kPerLane <= numel &&
            reinterpret_cast<uintptr_t>(at) % 16 == 0) {
            load_lane<Fmt>(at, raw[k]);
        } else {  // past the end, the chunk's padding, the gradient's end, or a start that is not 16-byte aligned
#pragma unroll
            for (int j = 0; j < kWordsPerLane<Fmt>; ++j) raw[k][j] = 0;  // the bits of +0.0 in every format
#pragma unroll
            for (int i = 0; i < kPerLane; ++i) {
                if (valid[k] && column + i < chunk && first + i < numel) {
                    const uint32_t bits = at[i];
                    if constexpr (sizeof(Bits) == 2)
                        raw[k][i / 2] |= bits << (16 * (i % 2));
                    else
                        raw[k][i] = bits;
                }
            }
        }
        destinations_of[k] = destination;
        row_groups[k] = row * groups_per_row + group;
    }
    uint32_t words[kGroupsPerWarp];
    float scales[kGroupsPerWarp];
    quantize_groups<Fmt, kGroupsPerWarp>(raw, words, scales);
#pragma unroll
    for (int k = 0; k < kGroupsPerWarp; ++k) {
        if (!valid[k]) break;
        uint8_t* block = out + destinations_of[k] * block_bytes;
        reinterpret_cast<uint32_t*>(block + row_groups[k] * int64_t(kGroup / 2))[warp.lane] = words[k];
        if (warp.lane == 0) reinterpret_cast<float*>(block + rows * padded_chunk / 2)[row_groups[k]] = scales[k];
    }
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
    const uint32_t groups_per_row = static_cast<uint32_t>(padded_chunk / kGroup);  // 32-bit: see encode_kernel
    const uint32_t row = static_cast<uint32_t>(warp.index) / groups_per_row;
    const uint32_t group = static_cast<uint32_t>(warp.index) - row * groups_per_row;
    const int64_t in_codes = rows * padded_chunk / 2;
    const int64_t in_block = in_codes + rows * static_cast<int64_t>(groups_per_row) * 4;
    float acc[1][kPerLane];
    dequantize_sum(in, in_block, sources, warp.index * (kGroup / 2) + warp.lane * 4, in_codes + warp.index * 4, acc[0]);
    uint32_t raw[1][kPerLane];
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) raw[0][i] = __float_as_uint(acc[0][i]);
    uint32_t words[1];
    float scales[1];
    quantize_groups<FloatFormat, 1>(raw, words, scales);
    uint8_t* block = out + row * (padded_chunk / 2 + static_cast<int64_t>(groups_per_row) * 4);
    reinterpret_cast<uint32_t*>(block + group * int64_t(kGroup / 2))[warp.lane] = words[0];
    if (warp.lane == 0) reinterpret_cast<float*>(block + padded_chunk / 2)[group] = scales[0];
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

// LoCo error feedback (deepspeed_zeropp/formats/int4.py, Feedback) on a lane's 8 fp32 inputs x of one group: v = x + e,
// with e the lane's 8 errors at `error` (16-byte aligned); v is quantized, and the errors become
// (beta * e) + (keep * (v - decoded v)), or 0 in a non-finite group. The same fp32 operations in the same order as
// int4.quantize_with_feedback.
__device__ __forceinline__ void quantize_with_feedback(const float (&x)[kPerLane],
                                                       float* __restrict__ error,
                                                       float beta,
                                                       float keep,
                                                       uint32_t& word,
                                                       float& scale)
{
    float4* errors = reinterpret_cast<float4*>(error);
    const float4 low = errors[0], high = errors[1];
    const float e[kPerLane] = {low.x, low.y, low.z, low.w, high.x, high.y, high.z, high.w};
    float v[kPerLane];
    uint32_t raw[1][kPerLane];
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
        v[i] = __fadd_rn(x[i], e[i]);
        raw[0][i] = __float_as_uint(v[i]);
    }
    uint32_t words[1];
    float scales[1];
    quantize_groups<FloatFormat, 1>(raw, words, scales);
    const bool finite = scales[0] == scales[0];  // quantize_groups stores NaN for a non-finite group
    float updated[kPerLane];
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
        const int code = static_cast<int32_t>(words[0] << (28 - 4 * i)) >> 28;  // sign-extends nibble i
        const float decoded = __fmul_rn(__fmul_rn(static_cast<float>(code), kStep), scales[0]);
        const float carried = __fmul_rn(beta, e[i]);
        const float fresh = __fmul_rn(keep, __fsub_rn(v[i], decoded));
        updated[i] = finite ? __fadd_rn(carried, fresh) : 0.f;
    }
    errors[0] = make_float4(updated[0], updated[1], updated[2], updated[3]);
    errors[1] = make_float4(updated[4], updated[5], updated[6], updated[7]);
    word = words[0];
    scale = scales[0];
}

// encode_kernel with error feedback, one group per warp (groups ordered by destination, row, group, which is also the
// order of the error buffer's values). Not tuned like encode_kernel: LoCo also reads and writes 8 bytes of error per
// value, so it moves several times the bytes of plain qgZ anyway.
template <typename Fmt>
__global__ void __launch_bounds__(kWarps * 32) encode_feedback_kernel(const typename Fmt::Bits* __restrict__ input,
                                                                      int64_t numel,
                                                                      int64_t chunk,
                                                                      int64_t padded_chunk,
                                                                      int destinations,
                                                                      int rows,
                                                                      float* __restrict__ error,
                                                                      float beta,
                                                                      float keep,
                                                                      uint8_t* __restrict__ out,
                                                                      int64_t block_bytes,
                                                                      int64_t total_groups)
{
    using Bits = typename Fmt::Bits;
    const Warp warp = this_warp();
    if (warp.index >= total_groups) return;
    const uint32_t groups_per_row = static_cast<uint32_t>(padded_chunk / kGroup);  // 32-bit: see encode_kernel
    const uint32_t row_index = static_cast<uint32_t>(warp.index) / groups_per_row;
    const uint32_t group = static_cast<uint32_t>(warp.index) - row_index * groups_per_row;
    const uint32_t destination = row_index / rows;
    const uint32_t row = row_index - destination * rows;
    const int64_t column = static_cast<int64_t>(group) * kGroup + warp.lane * kPerLane;               // within the chunk
    const int64_t first = (static_cast<int64_t>(row) * destinations + destination) * chunk + column;  // gradient
    const Bits* at = input + first;
    float x[kPerLane];
    if (column + kPerLane <= chunk && first + kPerLane <= numel && reinterpret_cast<uintptr_t>(at) % 16 == 0) {
        uint32_t raw[kWordsPerLane<Fmt>];
        load_lane<Fmt>(at, raw);
#pragma unroll
        for (int i = 0; i < kPerLane; ++i) x[i] = lane_value<Fmt>(raw, i);
    } else {  // the chunk's padding, the gradient's end, or a start that is not 16-byte aligned
#pragma unroll
        for (int i = 0; i < kPerLane; ++i) x[i] = column + i < chunk && first + i < numel ? Fmt::to_float(at[i]) : 0.f;
    }
    uint32_t word;
    float scale;
    quantize_with_feedback(x, error + warp.index * kGroup + warp.lane * kPerLane, beta, keep, word, scale);
    uint8_t* block = out + destination * block_bytes;
    const int64_t row_group = static_cast<int64_t>(row) * groups_per_row + group;
    reinterpret_cast<uint32_t*>(block + row_group * (kGroup / 2))[warp.lane] = word;
    if (warp.lane == 0) reinterpret_cast<float*>(block + rows * padded_chunk / 2)[row_group] = scale;
}

// reduce_encode_kernel with error feedback on the sums (error buffer: rows * padded_chunk values, in row order).
__global__ void __launch_bounds__(kWarps * 32) reduce_encode_feedback_kernel(const uint8_t* __restrict__ in,
                                                                             int sources,
                                                                             int rows,
                                                                             int64_t padded_chunk,
                                                                             float* __restrict__ error,
                                                                             float beta,
                                                                             float keep,
                                                                             uint8_t* __restrict__ out,
                                                                             int64_t total_groups)
{
    const Warp warp = this_warp();
    if (warp.index >= total_groups) return;
    const uint32_t groups_per_row = static_cast<uint32_t>(padded_chunk / kGroup);
    const uint32_t row = static_cast<uint32_t>(warp.index) / groups_per_row;
    const uint32_t group = static_cast<uint32_t>(warp.index) - row * groups_per_row;
    const int64_t in_codes = rows * padded_chunk / 2;
    const int64_t in_block = in_codes + rows * static_cast<int64_t>(groups_per_row) * 4;
    float acc[kPerLane];
    dequantize_sum(in, in_block, sources, warp.index * (kGroup / 2) + warp.lane * 4, in_codes + warp.index * 4, acc);
    uint32_t word;
    float scale;
    quantize_with_feedback(acc, error + warp.index * kGroup + warp.lane * kPerLane, beta, keep, word, scale);
    uint8_t* block = out + row * (padded_chunk / 2 + static_cast<int64_t>(groups_per_row) * 4);
    reinterpret_cast<uint32_t*>(block + group * int64_t(kGroup / 2))[warp.lane] = word;
    if (warp.lane == 0) reinterpret_cast<float*>(block + padded_chunk / 2)[group] = scale;
}

int64_t blocks_for(int64_t warps) { return (warps + kWarps - 1) / kWarps; }

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
    // Two groups per warp: with 6+ blocks per SM that keeps enough loads in flight without spilling registers.
    constexpr int kGroupsPerWarp = 2;
    const int64_t groups = static_cast<int64_t>(destinations) * rows * (padded_chunk / kGroup);
    const int64_t block_bytes = int4::block_bytes(rows, padded_chunk);
    if (groups == 0) return;
    const int64_t warps = (groups + kGroupsPerWarp - 1) / kGroupsPerWarp;
    const auto* bits = static_cast<const typename Fmt::Bits*>(input);
    encode_kernel<Fmt, kGroupsPerWarp><<<blocks_for(warps), kWarps * 32, 0, stream>>>(
        bits, numel, chunk, padded_chunk, destinations, rows, out, block_bytes, groups);
}

template <typename Fmt>
void decode_sum(const uint8_t* in, int sources, int64_t padded_chunk, float factor, void* out, int64_t count,
                cudaStream_t stream)
{
    if (count == 0) return;
    decode_sum_kernel<Fmt><<<blocks_for((count + kGroup - 1) / kGroup), kWarps * 32, 0, stream>>>(
        in, sources, padded_chunk, factor, static_cast<typename Fmt::Bits*>(out), count);
}

template <typename Fmt>
void encode_feedback(const void* input,
                     int64_t numel,
                     int64_t chunk,
                     int64_t padded_chunk,
                     int destinations,
                     int rows,
                     float* error,
                     float beta,
                     float keep,
                     uint8_t* out,
                     cudaStream_t stream)
{
    const int64_t groups = static_cast<int64_t>(destinations) * rows * (padded_chunk / kGroup);
    const int64_t block_bytes = int4::block_bytes(rows, padded_chunk);
    if (groups == 0) return;
    encode_feedback_kernel<Fmt><<<blocks_for(groups), kWarps * 32, 0, stream>>>(
        static_cast<const typename Fmt::Bits*>(input), numel, chunk, padded_chunk, destinations, rows, error, beta,
        keep, out, block_bytes, groups);
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
    dispatch_format(format, [&](auto fmt) {
        encode<decltype(fmt)>(input, numel, chunk, padded_chunk, destinations, rows, out, stream);
    });
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
    dispatch_format(format, [&](auto fmt) {
        decode_sum<decltype(fmt)>(in, sources, padded_chunk, factor, out, count, stream);
    });
}

void launch_qgz_encode_feedback(Format format,
                                const void* input,
                                int64_t numel,
                                int64_t chunk,
                                int64_t padded_chunk,
                                int destinations,
                                int rows,
                                float* error,
                                float beta,
                                float keep,
                                uint8_t* out,
                                cudaStream_t stream)
{
    dispatch_format(format, [&](auto fmt) {
        encode_feedback<decltype(fmt)>(
            input, numel, chunk, padded_chunk, destinations, rows, error, beta, keep, out, stream);
    });
}

void launch_qgz_reduce_encode_feedback(const uint8_t* in,
                                       int sources,
                                       int rows,
                                       int64_t padded_chunk,
                                       float* error,
                                       float beta,
                                       float keep,
                                       uint8_t* out,
                                       cudaStream_t stream)
{
    const int64_t groups = rows * (padded_chunk / kGroup);
    if (groups == 0) return;
    reduce_encode_feedback_kernel<<<blocks_for(groups), kWarps * 32, 0, stream>>>(
        in, sources, rows, padded_chunk, error, beta, keep, out, groups);
}

}  // namespace dszpp
