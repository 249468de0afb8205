// Host-side entry points of the native quantizers: symmetric int8 weights and qgZ's 4-bit gradient blocks (wire
// formats: docs/numerics.md; qgZ's constants: wire_formats.h).
//
// Kept free of torch headers so that the kernels compile in seconds; binding.cpp does the tensor checks
// and calls these with raw pointers on the caller's current stream.
#pragma once

#include <cuda_runtime.h>
#include <cstdint>

namespace dszpp {

enum class Format { kHalf, kBFloat16, kFloat };

// One block per contiguous group of `group_size` elements, the last one ending at `numel`
// ((groups - 1) * group_size < numel <= groups * group_size, or numel == 0); writes `numel` codes and `groups` scales.
void launch_quantize(Format format,
                     const void* input,
                     int8_t* codes,
                     float* scales,
                     int64_t groups,
                     int64_t group_size,
                     int64_t numel,
                     cudaStream_t stream);

// launch_quantize for several tensors of one format at once: segment i as launch_quantize(format, input, codes,
// scales, groups, group_size, numel) would quantize it, the same codes and scales. One kernel for every kMaxSegments
// segments whose input and codes are 16-byte aligned, and one for every kMaxSegments of the others.
constexpr int kMaxSegments = 32;
struct QuantizeSegment {
    const void* input;
    int8_t* codes;
    float* scales;
    int64_t groups, group_size, numel;
};
void launch_quantize_segments(Format format, const QuantizeSegment* segments, int64_t count, cudaStream_t stream);

// out[i] = codes[i] * scales[group of i], for i < numel. When block_numel is a multiple of group_size the group of i
// is i / group_size (numel may be a prefix of the groups). Otherwise the codes are blocks of block_numel elements,
// each quantized on its own in G = ceil(block_numel / group_size) groups with a short last one (numel may be a prefix
// of the blocks): the group of i is (i / block_numel) * G + (i % block_numel) / group_size.
void launch_dequantize(Format format,
                       const int8_t* codes,
                       const float* scales,
                       void* out,
                       int64_t numel,
                       int64_t group_size,
                       int64_t block_numel,
                       cudaStream_t stream);

// Rows apart in memory (the packets of an all-gather): row r's codes start at codes + r * row_stride bytes and its
// scales at scales + r * row_stride / 4 floats (row_stride a multiple of 4); each row holds row_numel codes in groups
// of group_size, the last one possibly short. Writes the first `count` values of the rows back to back into out
// (rows past them are not read; at most 65535 rows are read).
void launch_dequantize_rows(Format format,
                            const int8_t* codes,
                            const float* scales,
                            int64_t row_stride,
                            void* out,
                            int64_t row_numel,
                            int64_t count,
                            int64_t group_size,
                            cudaStream_t stream);

// One parameter's part of every row (launch_dequantize_parts): columns [first_column, first_column + numel) of each
// row, written to out row after row (a contiguous [rows, numel] buffer of `format`).
struct Part {
    Format format;
    int64_t first_column, numel;
    void* out;
};

// Rows as in launch_dequantize_rows (`codes` at row 0's column 0), the group of column c being c / group_size; writes
// each of the `count` parts. One kernel per output format and kind of part (alignment, index width) for every 16
// parts; at most 65535 rows.
void launch_dequantize_parts(const int8_t* codes,
                             const float* scales,
                             int64_t row_stride,
                             int64_t rows,
                             const Part* parts,
                             int64_t count,
                             int64_t group_size,
                             cudaStream_t stream);

// qgZ, groups of int4::kGroup values. A block of `rows` rows holds rows * padded_chunk / 2 bytes of codes, then one
// fp32 scale per group. Encode writes one block per destination d: row m quantizes chunk (m * destinations + d) of
// `input` (chunks of `chunk` values, zero-padded to padded_chunk, values past numel are 0).
void launch_qgz_encode(Format format,
                       const void* input,
                       int64_t numel,
                       int64_t chunk,
                       int64_t padded_chunk,
                       int destinations,
                       int rows,
                       uint8_t* out,
                       cudaStream_t stream);

// `sources` blocks of `rows` rows -> fp32 sum over sources -> `rows` blocks of one row each.
void launch_qgz_reduce_encode(const uint8_t* in,
                              int sources,
                              int rows,
                              int64_t padded_chunk,
                              uint8_t* out,
                              cudaStream_t stream);

// `sources` blocks of one row -> out[i] = (fp32 sum over sources)[i] * factor for i < count, rounded to `format`.
void launch_qgz_decode_sum(Format format,
                           const uint8_t* in,
                           int sources,
                           int64_t padded_chunk,
                           float factor,
                           void* out,
                           int64_t count,
                           cudaStream_t stream);

// LoCo: launch_qgz_encode / launch_qgz_reduce_encode with error feedback (docs/numerics.md): `error` holds
// one fp32 value per encoded value (destinations * rows * padded_chunk, resp. rows * padded_chunk; 16-byte aligned),
// added to the input before quantizing and updated in place; `keep` is 1 - beta.
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
                                cudaStream_t stream);

void launch_qgz_reduce_encode_feedback(const uint8_t* in,
                                       int sources,
                                       int rows,
                                       int64_t padded_chunk,
                                       float* error,
                                       float beta,
                                       float keep,
                                       uint8_t* out,
                                       cudaStream_t stream);

}  // namespace dszpp
