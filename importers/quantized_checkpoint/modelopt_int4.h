#pragma once
// What ModelOpt's Hugging Face export and TensorRT-LLM's checkpoint share when read back
// (../shared/REFERENCE.md 3.0, 3.5; nvidia-modelopt quant_utils.py pack_int4_in_uint8): int4
// packed two adjacent output rows per byte (row 2i in the low nibble, 2i + 1 in the high one,
// signed, no offset), and an AWQ pre-quant scale s [K] on the Linear's input, so that the engine
// computes (x * s) @ (q * scale)^T.
//
// qforge's quantized Linear (ir/quantized_linear.h) is integers and one scale per group of the
// input: (x * s) @ (q * scale)^T = x @ (q * scale')^T with scale'[n, j] = scale[n, j] * s_j holds
// only when s is one value s_j over each group j. It is folded where that product is exact in
// the scale's dtype (or float32), so the weight is the same number; otherwise Unsupported.
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ir/tensor.h"

namespace qforge {

// bytes [rows / 2, k] -> signed values [rows, k], row-major. `bytes` holds (rows / 2) * k.
std::vector<int8_t> unpack_int4_row_pairs(std::span<const uint8_t> bytes, int64_t rows,
                                          int64_t k);

// Signed values [n, k] (-8..7 for bits 4, -128..127 for 8) as an i4 (ONNX packing, low nibble
// first) or i8 tensor [n, k].
Tensor linear_values_tensor(std::span<const int8_t> q, int bits, int64_t n, int64_t k);

// `scale` [N, K / block] (or [N] with block 0: one group over K) with the pre-quant scale `pqs`
// [K] folded in as above; `scale` itself when every s is 1. Unsupported naming `pqs_name` when s
// varies within a group, is not finite, or a product is not exact in the scale's dtype or f32.
// InvalidInput when `pqs` is not a float [K].
Tensor fold_pre_quant_scale(const Tensor& scale, int64_t block, int64_t k, const Tensor& pqs,
                            const std::string& pqs_name, const std::string& where);

// `scale` converted to `dtype` when it holds every value exactly (a float32 scale that was a
// model-dtype scale written as float32), else `scale` unchanged.
Tensor narrow_scale(const Tensor& scale, std::optional<DType> dtype);

// fnmatch as Python's fnmatch.fnmatch on POSIX names: '*' any run, '?' one character, "[...]"
// a set; how TensorRT-LLM and ModelOpt match exclude_modules.
bool module_pattern_match(std::string_view pattern, std::string_view name);

}  // namespace qforge
