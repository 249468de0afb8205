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
// Rows (launch_dequantize_rows): the grid's second dimension walks rows that lie apart in memory (the packets of an
// all-gather, each rank's codes with its own scales); each row is an equal-groups layout of its own, read in place,
// and its values are written back to back. Packets stay 16-byte wide when every row's codes and output start on a
// 16-byte boundary. A run of columns of the rows (launch_dequantize_rows_into: one parameter's part of every rank's
// packet) is read the same way from its first column on: `base`, the run's first column, enters only the group
// index, and packets take one scale each only when it is a multiple of the packet size.
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

// Distances between consecutive rows, in elements of codes, scales and output (zero for a single row).
struct RowStrides {
    int64_t codes, scales, out;
};

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
                                                              Index row_numel,
                                                              Index last_numel,
                                                              RowStrides strides,
                                                              Index base,
                                                              Index group_size,
                                                              Index block_numel,
                                                              Index block_groups)
{
    using Bits = typename Fmt::Bits;
    const size_t row = blockIdx.y;
    const Index numel = row + 1 == gridDim.y ? last_numel : row_numel;
    codes += row * strides.codes;
    scales += row * strides.scales;
    out += row * strides.out;
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
            const float scale = __ldg(scales + (base + first) / group_size);
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
            group = (base + first) / group_size;
            offset = base + first - group * group_size;
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

// `rows` rows of `row_numel` values, the last one of `last_numel`, `strides` apart (one row: the flat layouts), read
// from column `base` of each row's equal groups on (0 but for launch_dequantize_rows_into; never in blocked layouts).
struct Rows {
    int64_t rows, row_numel, last_numel;
    RowStrides strides;
    int64_t base;
};

template <typename Fmt, int VEC, typename Index>
void launch_with(const int8_t* codes,
                 const float* scales,
                 typename Fmt::Bits* out,
                 const Rows& rows,
                 int64_t group_size,
                 int64_t block_numel,
                 cudaStream_t stream)
{
    const int64_t packets = (rows.row_numel + VEC - 1) / VEC;
    const dim3 grid(static_cast<unsigned>((packets + kThreads * kUnroll - 1) / (kThreads * kUnroll)),
                    static_cast<unsigned>(rows.rows));
    const int64_t block_groups = (block_numel + group_size - 1) / group_size;
    const auto n = static_cast<Index>(rows.row_numel);
    const auto last = static_cast<Index>(rows.last_numel);
    const auto size = static_cast<Index>(group_size);
    const auto base = static_cast<Index>(rows.base);
    if (block_numel % group_size == 0 && group_size % VEC == 0 && rows.base % VEC == 0)
        dequantize_kernel<Fmt, VEC, Index, false, true>
            <<<grid, kThreads, 0, stream>>>(codes, scales, out, n, last, rows.strides, base, size, 0, 0);
    else if (block_numel % group_size == 0)
        dequantize_kernel<Fmt, VEC, Index, false, false>
            <<<grid, kThreads, 0, stream>>>(codes, scales, out, n, last, rows.strides, base, size, 0, 0);
    else
        dequantize_kernel<Fmt, VEC, Index, true, false><<<grid, kThreads, 0, stream>>>(
            codes, scales, out, n, last, rows.strides, 0, size, static_cast<Index>(block_numel),
            static_cast<Index>(block_groups));
}

bool aligned16(const void* pointer) { return reinterpret_cast<uintptr_t>(pointer) % 16 == 0; }

template <typename Fmt>
void launch(const int8_t* codes,
            const float* scales,
            void* out,
            const Rows& rows,
            int64_t group_size,
            int64_t block_numel,
            cudaStream_t stream)
{
    using Bits = typename Fmt::Bits;
    constexpr int kVec = 16 / sizeof(Bits);
    if (rows.rows == 0 || rows.row_numel == 0) return;
    const bool aligned = aligned16(codes) && aligned16(out) && rows.strides.codes % 16 == 0 &&
                         (rows.strides.out * static_cast<int64_t>(sizeof(Bits))) % 16 == 0;
    // 32-bit indices (cheaper division) while neither packet index arithmetic nor the layout's sizes overflow them.
    const int64_t limit = int64_t(1) << 32;
    const bool narrow = rows.base + rows.row_numel + kThreads * kUnroll * kVec < limit && group_size < limit &&
                        block_numel < limit;
    Bits* bits = static_cast<Bits*>(out);
    if (aligned && narrow)
        launch_with<Fmt, kVec, uint32_t>(codes, scales, bits, rows, group_size, block_numel, stream);
    else if (aligned)
        launch_with<Fmt, kVec, uint64_t>(codes, scales, bits, rows, group_size, block_numel, stream);
    else
        launch_with<Fmt, 1, uint64_t>(codes, scales, bits, rows, group_size, block_numel, stream);
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
    const Rows layout{1, numel, numel, {0, 0, 0}, 0};
    dispatch_format(format, [&](auto fmt) {
        launch<decltype(fmt)>(codes, scales, out, layout, group_size, block_numel, stream);
    });
}

void launch_dequantize_rows(Format format,
                            const int8_t* codes,
                            const float* scales,
                            int64_t row_stride,
                            void* out,
                            int64_t row_numel,
                            int64_t count,
                            int64_t group_size,
                            cudaStream_t stream)
{
    if (count == 0) return;
    const int64_t used = (count + row_numel - 1) / row_numel;
    const RowStrides strides = used == 1 ? RowStrides{0, 0, 0} : RowStrides{row_stride, row_stride / 4, row_numel};
    const Rows layout{used, row_numel, count - (used - 1) * row_numel, strides, 0};
    dispatch_format(format, [&](auto fmt) {
        launch<decltype(fmt)>(codes, scales, out, layout, group_size, group_size, stream);
    });
}

void launch_dequantize_rows_into(Format format,
                                 const int8_t* codes,
                                 const float* scales,
                                 int64_t row_stride,
                                 int64_t first_column,
                                 void* out,
                                 int64_t rows,
                                 int64_t row_numel,
                                 int64_t group_size,
                                 cudaStream_t stream)
{
    if (rows == 0 || row_numel == 0) return;
    const RowStrides strides = rows == 1 ? RowStrides{0, 0, 0} : RowStrides{row_stride, row_stride / 4, row_numel};
    const Rows layout{rows, row_numel, row_numel, strides, first_column};
    dispatch_format(format, [&](auto fmt) {
        launch<decltype(fmt)>(codes, scales, out, layout, group_size, group_size, stream);
    });
}

}  // namespace dszpp
