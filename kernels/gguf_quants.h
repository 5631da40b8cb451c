#pragma once
// GGUF block quantizers (Q8_0, Q4_0, Q4_1) and the float passthroughs (F32, F16, BF16), bit-exact
// with ggml's reference quantizers (ggml-quants.c `quantize_row_*_ref`) and gguf-py's
// `gguf.quants.quantize`: the same float operations in the same order, fp16 scales rounded to
// nearest even. Rows run along ne[0] (a Linear weight's input features) in blocks of 32.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>

#include "ir/gguf_types.h"

namespace qforge {

// Bytes one row of `n` elements takes as `type`; throws InvalidInput when a block type's row
// is not a whole number of blocks.
uint64_t gguf_row_bytes(gguf::TensorType type, uint64_t n);

// Encodes `row` as `type` into `out` (exactly gguf_row_bytes(type, row.size()) bytes).
void gguf_quantize_row(gguf::TensorType type, std::span<const float> row, std::span<std::byte> out);

// Fills `out` with the `cols` float32 values of row `row`; called from several threads at once.
using GgufRowSource = std::function<void(int64_t row, std::span<float> out)>;

// `rows` rows of `cols` elements, each read through `source`, encoded as `type` into `out` (rows *
// gguf_row_bytes(type, cols) bytes): one parallel loop over the rows on the CPU kernels' threads,
// each thread with its own row buffer; each row's bytes are those of gguf_quantize_row, whatever
// the thread count.
void gguf_quantize_rows(gguf::TensorType type, int64_t rows, int64_t cols,
                        const GgufRowSource& source, std::span<std::byte> out);

// Encodes integer levels already chosen (a quantized checkpoint's) without choosing new ones:
// `q` holds one level per element (int4 levels in [-8, 7] for Q4_0 and Q4_1, int8 levels in
// [-127, 127] for Q8_0) and `d` one fp16 scale (its bits) per block of 32, so that the block
// dequantizes to exactly q * d: Q4_0 and Q8_0 store d and q (Q4_0 as q + 8), Q4_1 stores d, the
// minimum m = -8 * d and q + 8 (exact in float32: (q + 8) * d and -8 * d are exact, and so is
// their sum q * d). The caller checks that -8 * d is finite in fp16 (Q4_1).
void gguf_encode_levels_row(gguf::TensorType type, std::span<const int8_t> q,
                            std::span<const uint16_t> d, std::span<std::byte> out);

// Decodes `n` = out.size() elements of `type` from `in`, as gguf.quants.dequantize does.
void gguf_dequantize_row(gguf::TensorType type, std::span<const std::byte> in,
                         std::span<float> out);

}  // namespace qforge
