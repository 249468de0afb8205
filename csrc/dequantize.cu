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
// and its values are written back to back. Parts (launch_dequantize_parts: each parameter's part of every rank's
// packet, into a buffer of its own) are runs of columns of the rows, all of them in one launch: the grid's first
// dimension numbers the blocks of one run after those of the run before, and a block finds its run in the table it
// is passed. A run's first column, `base`, offsets its codes and enters the group index; its packets take one scale
// each only when it is a multiple of the packet size. Packets stay 16-byte wide where a run's codes and output rows
// start on 16-byte boundaries; runs that differ in that (or in index width) go to separate launches.
//
// Layouts (quantizer.h): equal groups, or blocks of block_numel elements each ending in a shorter group (a gather of
// per-rank quantized buffers). Groups are numbered block after block, so stepping always moves to the next scale; only
// a blocked layout has to track where in its block a group lies, to know the group's length. Equal groups compile to
// the kernel without that bookkeeping.
#include <algorithm>
#include <vector>

#include "formats.cuh"
#include "quantizer.h"

namespace dszpp {
namespace {

constexpr int kThreads = 256;  // with kUnroll 4: measured ahead of 128 x 8, 512 x 4 and 512 x 8 at 16M and 134M
constexpr int kUnroll = 4;

// Distances between consecutive rows, in elements of codes and scales (zero for a single row).
struct RowStrides {
    int64_t codes, scales;
};

// One run of columns of every row, written to a buffer of its own: columns [base, base + row_numel) of each row (the
// last row's: last_numel), row r's values at out + r * out_stride. first_tile: the launch's first block of this run
// (blocks of the grid's first dimension are numbered run after run).
struct Run {
    int64_t base, row_numel, last_numel, out_stride;
    void* out;
    int64_t first_tile;
};

// The runs of one launch, passed by value. A block finds its run by a scan over constant indices (no dynamic
// indexing of kernel parameters, which would copy the table to local memory), so a launch takes at most kMaxRuns.
constexpr int kMaxRuns = 16;
struct Runs {
    int count;
    Run run[kMaxRuns];
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
                                                              RowStrides strides,
                                                              Runs runs,
                                                              Index group_size,
                                                              Index block_numel,
                                                              Index block_groups)
{
    using Bits = typename Fmt::Bits;
    Run run = runs.run[0];
#pragma unroll
    for (int i = 1; i < kMaxRuns; ++i) {
        if (i >= runs.count || blockIdx.x < runs.run[i].first_tile) break;
        run = runs.run[i];
    }
    const size_t row = blockIdx.y;
    const Index numel = static_cast<Index>(row + 1 == gridDim.y ? run.last_numel : run.row_numel);
    const Index base = static_cast<Index>(run.base);
    codes += row * strides.codes + run.base;
    scales += row * strides.scales;
    Bits* __restrict__ out = static_cast<Bits*>(run.out) + row * run.out_stride;
    using CodePacket = PacketOf<int8_t, VEC>;
    using OutPacket = PacketOf<Bits, VEC>;
    const Index tile = static_cast<Index>(blockIdx.x - run.first_tile) * kThreads * kUnroll;

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

// What every run of a launch shares: the rows' codes (column 0 of row 0) and scales, their strides, the layout.
struct Rows {
    const int8_t* codes;
    const float* scales;
    int64_t rows;
    RowStrides strides;
    int64_t group_size, block_numel;
};

template <typename Fmt, int VEC, typename Index, bool kBlocked, bool kWhole>
void launch_runs(const Rows& rows, const std::vector<Run>& runs, cudaStream_t stream)
{
    const int64_t block_groups = (rows.block_numel + rows.group_size - 1) / rows.group_size;
    for (size_t first = 0; first < runs.size(); first += kMaxRuns) {
        Runs table{};
        table.count = static_cast<int>(std::min<size_t>(kMaxRuns, runs.size() - first));
        int64_t tiles = 0;
        for (int i = 0; i < table.count; ++i) {
            table.run[i] = runs[first + i];
            table.run[i].first_tile = tiles;
            const int64_t packets = (std::max(table.run[i].row_numel, table.run[i].last_numel) + VEC - 1) / VEC;
            tiles += (packets + kThreads * kUnroll - 1) / (kThreads * kUnroll);
        }
        const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(rows.rows));
        dequantize_kernel<Fmt, VEC, Index, kBlocked, kWhole>
            <<<grid, kThreads, 0, stream>>>(rows.codes, rows.scales, rows.strides, table,
                                            static_cast<Index>(rows.group_size), static_cast<Index>(rows.block_numel),
                                            static_cast<Index>(block_groups));
    }
}

bool aligned16(const void* pointer) { return reinterpret_cast<uintptr_t>(pointer) % 16 == 0; }

// Sorts the runs into the kernel's instantiations and launches each class: packets 16 bytes wide where the run's
// codes and output rows start on 16-byte boundaries, 32-bit indices (cheaper division) while neither packet index
// arithmetic nor the layout's sizes overflow them, one scale per packet where packets cannot straddle groups.
// A blocked layout (block_numel not a multiple of group_size) comes in one run from column 0.
template <typename Fmt>
void launch(const Rows& rows, const std::vector<Run>& runs, cudaStream_t stream)
{
    using Bits = typename Fmt::Bits;
    constexpr int kVec = 16 / sizeof(Bits);
    const int64_t limit = int64_t(1) << 32;
    const bool blocked = rows.block_numel % rows.group_size != 0;
    // classes: [wide packets, 32-bit][wide packets, 64-bit][one element] x [one scale per packet, per element]
    std::vector<Run> classes[3][2];
    for (const Run& run : runs) {
        if (rows.rows == 0 || run.row_numel == 0) continue;
        const bool aligned = aligned16(rows.codes + run.base) && aligned16(run.out) && rows.strides.codes % 16 == 0 &&
                             (run.out_stride * static_cast<int64_t>(sizeof(Bits))) % 16 == 0;
        const bool narrow = run.base + run.row_numel + kThreads * kUnroll * kVec < limit &&
                            rows.group_size < limit && rows.block_numel < limit;
        const int vec = aligned ? kVec : 1;
        const bool whole = !blocked && rows.group_size % vec == 0 && run.base % vec == 0;
        classes[aligned ? (narrow ? 0 : 1) : 2][whole ? 0 : 1].push_back(run);
    }
    if (blocked) {
        launch_runs<Fmt, kVec, uint32_t, true, false>(rows, classes[0][1], stream);
        launch_runs<Fmt, kVec, uint64_t, true, false>(rows, classes[1][1], stream);
        launch_runs<Fmt, 1, uint64_t, true, false>(rows, classes[2][1], stream);
        return;
    }
    launch_runs<Fmt, kVec, uint32_t, false, true>(rows, classes[0][0], stream);
    launch_runs<Fmt, kVec, uint32_t, false, false>(rows, classes[0][1], stream);
    launch_runs<Fmt, kVec, uint64_t, false, true>(rows, classes[1][0], stream);
    launch_runs<Fmt, kVec, uint64_t, false, false>(rows, classes[1][1], stream);
    launch_runs<Fmt, 1, uint64_t, false, true>(rows, classes[2][0], stream);
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
    const Rows rows{codes, scales, 1, {0, 0}, group_size, block_numel};
    const std::vector<Run> runs{Run{0, numel, numel, 0, out, 0}};
    dispatch_format(format, [&](auto fmt) { launch<decltype(fmt)>(rows, runs, stream); });
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
    const Rows rows{codes, scales, used, used == 1 ? RowStrides{0, 0} : RowStrides{row_stride, row_stride / 4},
                    group_size, group_size};
    const std::vector<Run> runs{Run{0, row_numel, count - (used - 1) * row_numel, row_numel, out, 0}};
    dispatch_format(format, [&](auto fmt) { launch<decltype(fmt)>(rows, runs, stream); });
}

void launch_dequantize_parts(const int8_t* codes,
                             const float* scales,
                             int64_t row_stride,
                             int64_t rows,
                             const Part* parts,
                             int64_t count,
                             int64_t group_size,
                             cudaStream_t stream)
{
    if (rows == 0) return;
    const Rows layout{codes, scales, rows, rows == 1 ? RowStrides{0, 0} : RowStrides{row_stride, row_stride / 4},
                      group_size, group_size};
    for (Format format : {Format::kHalf, Format::kBFloat16, Format::kFloat}) {
        std::vector<Run> runs;
        for (int64_t i = 0; i < count; ++i)
            if (parts[i].format == format)
                runs.push_back(Run{parts[i].first_column, parts[i].numel, parts[i].numel, parts[i].numel,
                                   parts[i].out, 0});
        if (!runs.empty()) dispatch_format(format, [&](auto fmt) { launch<decltype(fmt)>(layout, runs, stream); });
    }
}

}  // namespace dszpp
