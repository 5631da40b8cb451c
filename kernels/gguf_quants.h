#pragma once
// GGUF block quantizers (Q8_0, Q4_0, Q4_1) and the float passthroughs (F32, F16, BF16), bit-exact
// with ggml's reference quantizers (ggml-quants.c `quantize_row_*_ref`) and gguf-py's
// `gguf.quants.quantize`: the same float operations in the same order, fp16 scales rounded to
// nearest even. Rows run along ne[0] (a Linear weight's input features) in blocks of 32.
#include <cstddef>
#include <cstdint>
#include <span>

#include "ir/gguf_types.h"

namespace qforge {

// Bytes one row of `n` elements takes as `type`; throws InvalidInput when a block type's row
// is not a whole number of blocks.
uint64_t gguf_row_bytes(gguf::TensorType type, uint64_t n);

// Encodes `row` as `type` into `out` (exactly gguf_row_bytes(type, row.size()) bytes).
void gguf_quantize_row(gguf::TensorType type, std::span<const float> row, std::span<std::byte> out);

// Decodes `n` = out.size() elements of `type` from `in`, as gguf.quants.dequantize does.
void gguf_dequantize_row(gguf::TensorType type, std::span<const std::byte> in,
                         std::span<float> out);

}  // namespace qforge
