// Symmetric int8 quantization of contiguous groups; the last group may be shorter (formats/grouping.py).
//
// Groups of up to 4 packets per lane of a warp (1024 16-bit or 512 32-bit elements) take one warp each; larger
// groups one thread block each (DeepSpeed's usual 2048- and 4096-element groups among them). Either way a group is
// read once into registers, its exact absmax reduced (warp shuffles; plus shared memory and one barrier in a block),
// and its codes written from registers: input bytes cross the memory bus once.
//
// The block kernel reads its group in one round of LOADS 16-byte loads per thread when it fits: 2 for groups of up to
// 8 packets per lane of a warp (up to 128 threads), else 4 (up to 64 KiB per group at 1024 threads, four times
// DeepSpeed's largest group). Larger groups (only an explicit group count makes them) take a second pass over the
// input, which then mostly hits L2. Whatever the group size, the aligned interior of a group moves in 16-byte loads;
// the few elements before the first and after the last 16-byte boundary of the group are handled one at a time. An
// input pointer that is not 16-byte aligned runs the same kernels with single-element packets.
//
// Measured on H200 in one process: 4096-element 16-bit groups kept in one warp (16 loads per lane, ~90 registers, 5
// blocks an SM) ran 7-9% slower at 16M elements and 1.5% slower at 134M than in a block of 128 threads (one round in
// 42 registers: twice the resident warps). 2048-element groups in one warp (8 loads per lane, 59 registers) ran
// 1.5% slower at 16M and 1.5% at 134M than in a block of 128 threads with 2 loads each (32 registers: 64 warps an
// SM), and level with 64 threads of 4 loads. The saturating conversion in quantize_value made the one-warp groups ~5%
// faster at 16M.
//
// At 134M elements in 4096-element 16-bit groups DeepSpeed's fp16 op stays 0.3-0.9% ahead of this kernel (both above
// the copy). Tried against it in one process, 15 interleaved trials, codes and scales identical, median GB/s of the
// fp16 kernel at 134M: DeepSpeed's own geometry for these groups (256 threads, 2 loads each, 32 registers) 4194 against
// 4196 for 128 threads of 4 loads; plain ld.global instead of the non-coherent load path 4204 against 4207; a
// persistent grid-stride block that prefetches its next group before reducing the current one 3921 against 4190
// (2048-element groups 3998 against 4221; with 4 loads 3675); 512 threads of 1 load 2988. None was kept.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "formats.cuh"
#include "quantizer.h"

namespace dszpp {
namespace {

// 16-byte loads in flight per thread of the block kernel: kSmallLoads for groups of up to kSmallPackets packets
// (fewer registers: more resident warps), else kLoads (2 measured slower for 4096-element groups).
constexpr int kLoads = 4;
constexpr int kSmallLoads = 2;
constexpr int kSmallPackets = 256;
constexpr int kMaxThreads = 1024;
constexpr int kMinThreads = 32;
// The warp kernel: 4 groups per block (measured ahead of 8 at 16M elements: a shorter tail), up to kWarpLoads packets
// kept per lane (groups up to 1024 16-bit or 512 32-bit elements; longer ones go to the block kernel).
constexpr int kWarpBlockThreads = 128;
constexpr int kWarpLoads = 4;

// The one-round block kernel's loads and code stores carry cache-streaming hints (load_streaming / store_streaming,
// formats.cuh) for inputs of up to kStreamingBytes. Measured in one process on H200 (codes and scales identical): 3-6%
// faster at 16M elements whatever ran before; at 134M level when it follows a quantize, 7-9% slower when it follows a
// kernel that writes a large new tensor (a clone or DeepSpeed's dequantize), so larger inputs load and store plainly.
// The hints on the warp kernel's loads were +5% at 16M and -1.5 to -2% at 134M; a 256-byte L2 prefetch hint was level
// to -3%.
constexpr int64_t kStreamingBytes = int64_t(64) << 20;

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

// __fmul_rn: one IEEE rounding, never fused into anything else. cvt.rni.sat.s8.f32 rounds half to even and clamps
// to [-128, 127] in one instruction (two fewer than __float2int_rn and a clamp, and fewer registers), and turns NaN
// into 0: a group that is not finite gets the multiplier 0 (multiplier_for), so each of its values becomes 0 or NaN
// and its codes all 0.
__device__ __forceinline__ int8_t quantize_value(float value, float multiplier)
{
    int code;
    asm("cvt.rni.sat.s8.f32 %0, %1;" : "=r"(code) : "f"(__fmul_rn(value, multiplier)));
    return static_cast<int8_t>(code);
}

template <typename Fmt>
__device__ __forceinline__ int8_t quantize_one(uint32_t bits, float multiplier)
{
    return quantize_value(Fmt::to_float(bits), multiplier);
}

// A packet's elements widened to float. bfloat16 packets are read as 32-bit words: the even element is the low
// half (little-endian), widened by one shift; the odd one is the high half, widened by one mask. This saves the
// per-element half-word extraction that the generic path compiles to (bf16 quantize measured ~8% below fp16).
template <typename Fmt, int VEC, typename P>
__device__ __forceinline__ void widen(const P& packet, float (&values)[VEC])
{
    if constexpr (std::is_same<Fmt, BFloat16Format>::value && VEC % 2 == 0) {
        uint32_t words[VEC / 2];
        static_assert(sizeof(words) == sizeof(packet.raw), "a bf16 packet is a whole number of 32-bit words");
        memcpy(words, packet.raw, sizeof(words));
#pragma unroll
        for (int i = 0; i < VEC / 2; ++i) {
            values[2 * i] = __uint_as_float(words[i] << 16);
            values[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
        }
    } else {
#pragma unroll
        for (int j = 0; j < VEC; ++j) values[j] = Fmt::to_float(packet.e[j]);
    }
}

// Correctly rounded 128 / absmax and 1 / multiplier, as formats/int8.py computes them: IEEE float division (__fdiv_rn,
// never the fast approximation), subnormal results included; for tiny groups 128 / absmax overflows to inf, which the
// FLT_MAX cap turns into a finite multiplier. A group that is not finite (inf or NaN among its values) gets 0.
__device__ __forceinline__ float multiplier_for(float absmax, bool finite)
{
    if (!finite) return 0.f;
    return absmax == 0.f ? 1.f : fminf(__fdiv_rn(128.f, absmax), FLT_MAX);
}

__device__ __forceinline__ float stored_scale(float multiplier, bool finite)
{
    return finite ? __fdiv_rn(1.f, multiplier) : NAN;
}

// The running largest magnitude, with one more packet. 16-bit elements go two at a time through 32-bit words and a
// per-halfword unsigned max (__vmaxu2): measured 3-20% faster for bf16 than one element at a time.
template <typename Fmt, int VEC, typename P>
__device__ __forceinline__ uint32_t packet_magnitude(const P& packet, uint32_t running)
{
    if constexpr (sizeof(typename Fmt::Bits) == 2 && VEC % 2 == 0) {
        uint32_t words[VEC / 2];
        memcpy(words, packet.raw, sizeof(words));
        uint32_t pair = 0;
#pragma unroll
        for (int i = 0; i < VEC / 2; ++i) pair = __vmaxu2(pair, words[i] & 0x7fff7fffu);
        return max(running, max(pair & 0xffffu, pair >> 16));
    } else {
#pragma unroll
        for (int j = 0; j < VEC; ++j) running = max(running, Fmt::magnitude(packet.e[j]));
        return running;
    }
}

// One packet of input, widened and quantized, stored as one packet of codes.
template <typename Fmt, int VEC, bool STREAM = false, typename InPacket>
__device__ __forceinline__ void store_codes(const InPacket& packet, float multiplier, PacketOf<int8_t, VEC>* target)
{
    float values[VEC];
    widen<Fmt, VEC>(packet, values);
    PacketOf<int8_t, VEC> out;
#pragma unroll
    for (int j = 0; j < VEC; ++j) out.e[j] = quantize_value(values[j], multiplier);
    if constexpr (STREAM)
        store_streaming(&target->raw[0], out.raw[0]);
    else
        target->raw[0] = out.raw[0];
}

// ONE_ROUND: the group fits in one round of LOADS packets per thread, kept in registers; otherwise a first pass
// reduces the absmax round by round and a second one reads the group again for the codes. The one-round kernel is a
// separate instantiation because it needs fewer registers (42-43 against 46 for LOADS 4), which fits one more block
// of 128 threads an SM. STREAM: the cache-streaming hints (kStreamingBytes); only with ONE_ROUND, whose loads are the
// only ones of their bytes. An instantiation for groups that fill the block exactly (no bounds or edge checks: 32
// registers instead of 42 for 16-bit 4096-element groups) measured +1-2% in 16-bit at 16M, level at 134M and 5% slower
// in fp32 at 16M, so it was not kept.
//
// The block's work: group `group` of `input` (groups of group_size elements, the last one ending at numel). Both the
// one-tensor kernel and the segments kernel below run it, one group per block.
template <typename Fmt, int VEC, bool ONE_ROUND, int LOADS, bool STREAM>
__device__ __forceinline__ void quantize_group(const typename Fmt::Bits* __restrict__ input,
                                               int8_t* __restrict__ codes,
                                               float* __restrict__ scales,
                                               int64_t group,
                                               int64_t group_size,
                                               int64_t numel)
{
    using Bits = typename Fmt::Bits;
    using InPacket = PacketOf<Bits, VEC>;
    using CodePacket = PacketOf<int8_t, VEC>;

    const int64_t start = group * group_size;
    const int64_t end = min(start + group_size, numel);
    const int64_t body_start = min((start + VEC - 1) / VEC * VEC, end);
    const int64_t body_end = max(end / VEC * VEC, body_start);
    // In-group offsets fit 32 bits (checked on the host); 64-bit index arithmetic would cost registers.
    const int packets = static_cast<int>((body_end - body_start) / VEC);
    const int head = static_cast<int>(body_start - start);
    const int edge = head + static_cast<int>(end - body_end);  // < 2 * VEC <= blockDim.x
    const InPacket* body = reinterpret_cast<const InPacket*>(input + body_start);
    CodePacket* body_codes = reinterpret_cast<CodePacket*>(codes + body_start);

    const int stride = blockDim.x * LOADS;  // packets per round
    InPacket cache[LOADS];
    auto load = [&](int base) {
#pragma unroll
        for (int k = 0; k < LOADS; ++k) {
            const int idx = base + threadIdx.x + k * blockDim.x;
#pragma unroll
            for (int r = 0; r < sizeof(cache[k].raw) / sizeof(cache[k].raw[0]); ++r)
                cache[k].raw[r] = idx >= packets ? typename InPacket::RawType{}
                                  : STREAM       ? load_streaming(&body[idx].raw[r])
                                                 : body[idx].raw[r];
        }
    };
    auto store = [&](int base, float multiplier) {
#pragma unroll
        for (int k = 0; k < LOADS; ++k) {
            const int idx = base + threadIdx.x + k * blockDim.x;
            if (idx < packets) store_codes<Fmt, VEC, STREAM>(cache[k], multiplier, body_codes + idx);
        }
    };

    uint32_t magnitude = 0;
    if constexpr (ONE_ROUND) {
        load(0);
#pragma unroll
        for (int k = 0; k < LOADS; ++k) magnitude = packet_magnitude<Fmt, VEC>(cache[k], magnitude);
    } else {
        for (int base = 0; base < packets; base += stride) {
            load(base);
#pragma unroll
            for (int k = 0; k < LOADS; ++k) magnitude = packet_magnitude<Fmt, VEC>(cache[k], magnitude);
        }
    }
    const int lane = threadIdx.x;
    const bool has_edge = lane < edge;
    const int64_t edge_index = lane < head ? start + lane : body_end + (lane - head);
    const Bits edge_bits = has_edge ? input[edge_index] : Bits(0);
    magnitude = max(magnitude, Fmt::magnitude(edge_bits));

    const float absmax = Fmt::to_float(block_max(magnitude));
    const bool finite = absmax <= FLT_MAX;  // false for inf and NaN
    const float multiplier = multiplier_for(absmax, finite);
    if (threadIdx.x == 0) scales[group] = stored_scale(multiplier, finite);

    if constexpr (ONE_ROUND) {
        store(0, multiplier);
    } else {
        for (int base = 0; base < packets; base += stride) {
            load(base);
            store(base, multiplier);
        }
    }
    if (has_edge) codes[edge_index] = quantize_one<Fmt>(edge_bits, multiplier);
}

template <typename Fmt, int VEC, bool ONE_ROUND, int LOADS, bool STREAM>
__global__ void __launch_bounds__(kMaxThreads) quantize_kernel(const typename Fmt::Bits* __restrict__ input,
                                                               int8_t* __restrict__ codes,
                                                               float* __restrict__ scales,
                                                               int64_t group_size,
                                                               int64_t numel)
{
    quantize_group<Fmt, VEC, ONE_ROUND, LOADS, STREAM>(input, codes, scales, blockIdx.x, group_size, numel);
}

// Several tensors in one launch (launch_quantize_segments): the grid numbers the groups of one segment after those of
// the segment before, and a block finds its segment in the table it is passed by a scan over constant indices (no
// dynamic indexing of kernel parameters, which would copy the table to local memory), as the dequantize kernel finds
// its run. One block per group whatever the group size: the one-warp kernel's small groups are not worth a class of
// their own here (ZeRO partitions are quantized in DeepSpeed's 2048- and 4096-element groups, or ours of up to 8000).
struct Segment {
    const void* input;
    int8_t* codes;
    float* scales;
    int64_t group_size, numel, first_block;
};
struct Segments {
    int count;
    Segment segment[kMaxSegments];
};

template <typename Fmt, int VEC, bool ONE_ROUND, int LOADS>
__global__ void __launch_bounds__(kMaxThreads) quantize_segments_kernel(const Segments table)
{
    const int64_t block = blockIdx.x;
    int at = 0;
#pragma unroll
    for (int i = 1; i < kMaxSegments; ++i)
        if (i < table.count && table.segment[i].first_block <= block) at = i;
    Segment s = table.segment[0];
#pragma unroll
    for (int i = 1; i < kMaxSegments; ++i)
        if (i == at) s = table.segment[i];
    quantize_group<Fmt, VEC, ONE_ROUND, LOADS, false>(static_cast<const typename Fmt::Bits*>(s.input), s.codes,
                                                      s.scales, block - s.first_block, s.group_size, s.numel);
}

// Small groups: one warp per group, several groups per block. A lane keeps its up to LOADS packets in registers
// between the absmax and the codes, and the absmax needs only warp shuffles: no shared memory, no barrier, and a
// warp that finishes does not wait for the others of its block.
template <typename Fmt, int VEC, int LOADS>
__global__ void __launch_bounds__(kWarpBlockThreads) quantize_warp_kernel(const typename Fmt::Bits* __restrict__ input,
                                                                          int8_t* __restrict__ codes,
                                                                          float* __restrict__ scales,
                                                                          int64_t groups,
                                                                          int64_t group_size,
                                                                          int64_t numel)
{
    using Bits = typename Fmt::Bits;
    using InPacket = PacketOf<Bits, VEC>;
    using CodePacket = PacketOf<int8_t, VEC>;

    const int64_t group = static_cast<int64_t>(blockIdx.x) * (kWarpBlockThreads / 32) + threadIdx.x / 32;
    if (group >= groups) return;
    const int lane = threadIdx.x % 32;
    const int64_t start = group * group_size;
    const int64_t end = min(start + group_size, numel);
    const int64_t body_start = min((start + VEC - 1) / VEC * VEC, end);
    const int64_t body_end = max(end / VEC * VEC, body_start);
    const int packets = static_cast<int>((body_end - body_start) / VEC);  // <= 32 * LOADS (checked at launch)
    const int head = static_cast<int>(body_start - start);
    const int edge = head + static_cast<int>(end - body_end);  // < 2 * VEC <= 32
    const InPacket* body = reinterpret_cast<const InPacket*>(input + body_start);
    CodePacket* body_codes = reinterpret_cast<CodePacket*>(codes + body_start);

    InPacket cache[LOADS];
#pragma unroll
    for (int k = 0; k < LOADS; ++k) {
        const int idx = lane + 32 * k;
#pragma unroll
        for (int r = 0; r < sizeof(cache[k].raw) / sizeof(cache[k].raw[0]); ++r)
            cache[k].raw[r] = idx < packets ? body[idx].raw[r] : typename InPacket::RawType{};
    }
    const bool has_edge = lane < edge;
    const int64_t edge_index = lane < head ? start + lane : body_end + (lane - head);
    const Bits edge_bits = has_edge ? input[edge_index] : Bits(0);

    uint32_t magnitude = Fmt::magnitude(edge_bits);
#pragma unroll
    for (int k = 0; k < LOADS; ++k)
        magnitude = packet_magnitude<Fmt, VEC>(cache[k], magnitude);
    const float absmax = Fmt::to_float(warp_max(magnitude));
    const bool finite = absmax <= FLT_MAX;  // false for inf and NaN
    const float multiplier = multiplier_for(absmax, finite);
    if (lane == 0) scales[group] = stored_scale(multiplier, finite);

#pragma unroll
    for (int k = 0; k < LOADS; ++k) {
        const int idx = lane + 32 * k;
        if (idx < packets) store_codes<Fmt, VEC>(cache[k], multiplier, body_codes + idx);
    }
    if (has_edge) codes[edge_index] = quantize_one<Fmt>(edge_bits, multiplier);
}

template <typename Fmt, int VEC, int LOADS>
void launch_warps(const typename Fmt::Bits* input,
                  int8_t* codes,
                  float* scales,
                  int64_t groups,
                  int64_t group_size,
                  int64_t numel,
                  cudaStream_t stream)
{
    constexpr int per_block = kWarpBlockThreads / 32;
    const int64_t blocks = (groups + per_block - 1) / per_block;
    quantize_warp_kernel<Fmt, VEC, LOADS>
        <<<blocks, kWarpBlockThreads, 0, stream>>>(input, codes, scales, groups, group_size, numel);
}

// The fewest threads (a power of two from kMinThreads to kMaxThreads) that cover `packets` at `loads` each.
int threads_for(int64_t packets, int loads)
{
    int threads = kMinThreads;
    while (threads * static_cast<int64_t>(loads) < packets && threads < kMaxThreads) threads <<= 1;
    return threads;
}

template <typename Fmt, int VEC, int LOADS>
void launch_one_round(const typename Fmt::Bits* input,
                      int8_t* codes,
                      float* scales,
                      int64_t groups,
                      int64_t group_size,
                      int64_t numel,
                      int threads,
                      bool streaming,
                      cudaStream_t stream)
{
    if (streaming)
        quantize_kernel<Fmt, VEC, true, LOADS, true>
            <<<groups, threads, 0, stream>>>(input, codes, scales, group_size, numel);
    else
        quantize_kernel<Fmt, VEC, true, LOADS, false>
            <<<groups, threads, 0, stream>>>(input, codes, scales, group_size, numel);
}

template <typename Fmt, int VEC>
void launch_with(const typename Fmt::Bits* input,
                 int8_t* codes,
                 float* scales,
                 int64_t groups,
                 int64_t group_size,
                 int64_t numel,
                 cudaStream_t stream)
{
    // A group's body spans at most group_size / VEC packets (fewer when it does not start on a packet boundary).
    const int64_t per_lane = (group_size / VEC + 31) / 32;
    static_assert(kWarpLoads == 4, "one instantiation per power of two up to kWarpLoads");
    if (per_lane <= 1) return launch_warps<Fmt, VEC, 1>(input, codes, scales, groups, group_size, numel, stream);
    if (per_lane <= 2) return launch_warps<Fmt, VEC, 2>(input, codes, scales, groups, group_size, numel, stream);
    if (per_lane <= 4) return launch_warps<Fmt, VEC, 4>(input, codes, scales, groups, group_size, numel, stream);
    const int64_t packets = (group_size + VEC - 1) / VEC;
    static_assert(kSmallPackets <= kSmallLoads * kMaxThreads, "small groups take one round");
    const bool streaming = numel * static_cast<int64_t>(sizeof(typename Fmt::Bits)) <= kStreamingBytes;
    if (packets <= kSmallPackets)
        return launch_one_round<Fmt, VEC, kSmallLoads>(
            input, codes, scales, groups, group_size, numel, threads_for(packets, kSmallLoads), streaming, stream);
    const int threads = threads_for(packets, kLoads);
    if (threads * static_cast<int64_t>(kLoads) >= packets)
        return launch_one_round<Fmt, VEC, kLoads>(
            input, codes, scales, groups, group_size, numel, threads, streaming, stream);
    quantize_kernel<Fmt, VEC, false, kLoads, false>
        <<<groups, threads, 0, stream>>>(input, codes, scales, group_size, numel);
}

template <typename Fmt>
void launch(const void* input,
            int8_t* codes,
            float* scales,
            int64_t groups,
            int64_t group_size,
            int64_t numel,
            cudaStream_t stream)
{
    using Bits = typename Fmt::Bits;
    const bool aligned = reinterpret_cast<uintptr_t>(input) % 16 == 0 && reinterpret_cast<uintptr_t>(codes) % 16 == 0;
    const Bits* bits = static_cast<const Bits*>(input);
    if (aligned)
        launch_with<Fmt, 16 / sizeof(Bits)>(bits, codes, scales, groups, group_size, numel, stream);
    else
        launch_with<Fmt, 1>(bits, codes, scales, groups, group_size, numel, stream);
}

// One class of segments (the same vector width) in launches of at most kMaxSegments: the block size that covers the
// largest group of the launch in one round (or two passes over groups too large for one).
template <typename Fmt, int VEC>
void launch_segments(const std::vector<QuantizeSegment>& segments, cudaStream_t stream)
{
    for (size_t first = 0; first < segments.size(); first += kMaxSegments) {
        Segments table{};
        int64_t blocks = 0, largest = 0;
        for (size_t i = first; i < segments.size() && i < first + kMaxSegments; ++i) {
            const QuantizeSegment& s = segments[i];
            table.segment[table.count++] = Segment{s.input, s.codes, s.scales, s.group_size, s.numel, blocks};
            blocks += s.groups;
            largest = std::max(largest, (s.group_size + VEC - 1) / VEC);
        }
        if (blocks == 0) continue;
        if (largest <= kSmallPackets) {
            quantize_segments_kernel<Fmt, VEC, true, kSmallLoads>
                <<<blocks, threads_for(largest, kSmallLoads), 0, stream>>>(table);
            continue;
        }
        const int threads = threads_for(largest, kLoads);
        if (threads * static_cast<int64_t>(kLoads) >= largest)
            quantize_segments_kernel<Fmt, VEC, true, kLoads><<<blocks, threads, 0, stream>>>(table);
        else
            quantize_segments_kernel<Fmt, VEC, false, kLoads><<<blocks, threads, 0, stream>>>(table);
    }
}

}  // namespace

void launch_quantize_segments(Format format, const QuantizeSegment* segments, int64_t count, cudaStream_t stream)
{
    dispatch_format(format, [&](auto fmt) {
        using Fmt = decltype(fmt);
        std::vector<QuantizeSegment> wide, narrow;  // 16-byte aligned input and codes, or not
        for (int64_t i = 0; i < count; ++i) {
            const QuantizeSegment& s = segments[i];
            if (s.numel == 0) continue;
            const bool aligned =
                reinterpret_cast<uintptr_t>(s.input) % 16 == 0 && reinterpret_cast<uintptr_t>(s.codes) % 16 == 0;
            (aligned ? wide : narrow).push_back(s);
        }
        launch_segments<Fmt, 16 / sizeof(typename Fmt::Bits)>(wide, stream);
        launch_segments<Fmt, 1>(narrow, stream);
    });
}

void launch_quantize(Format format,
                     const void* input,
                     int8_t* codes,
                     float* scales,
                     int64_t groups,
                     int64_t group_size,
                     int64_t numel,
                     cudaStream_t stream)
{
    dispatch_format(format, [&](auto fmt) {
        launch<decltype(fmt)>(input, codes, scales, groups, group_size, numel, stream);
    });
}

}  // namespace dszpp
