#pragma once
// How a weights-only graph (a model folder's tensors, no nodes) holds a quantized Linear weight
// W [out, in] (y = x W^T): the initializer keeps W's name and holds the integers in shape
// [out, in] (i4 two per byte, low nibble first as ONNX does, or i8); its scale is
// "<name>_scale" in the folder's float dtype, [out, in / block_size] for blocks along `in`
// (W4A16) or [out] for one scale per output channel (INT8 weight-only); a QuantRecord with no
// reader ties them. Symmetric: value = q * scale. Quantizing passes write this form, the
// model-folder exporters (compressed-tensors, GPTQ, AWQ, GGUF, TensorRT-LLM) read it.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "ir/graph.h"
#include "ir/tensor.h"

namespace qforge {

std::string quantized_linear_scale_name(std::string_view weight);

// Replaces initializer `weight` by `values` (i4 or i8, [out, in]) and adds its scale and record.
// block_size > 0: blocks along `in` (scale [out, in / block_size]); 0: per output channel
// (scale [out]). Throws Internal when the shapes do not agree.
void store_quantized_linear(Graph& graph, const std::string& weight, Tensor values, Tensor scale,
                            int64_t block_size);

// The float weight a quantized Linear stands for: q * scale, each product computed in f32 (exact
// for 4- and 8-bit q and a 16-bit scale) and rounded once to `dtype`; by default the scale's
// dtype, as compressed-tensors' decompress and transformers compute it (llama.cpp keeps a GGUF
// block's products in f32). [out, in]. Throws Internal when `r` is not a quantized Linear of
// `graph`.
Tensor dequantize_quantized_linear(const Graph& graph, const QuantRecord& r,
                                   std::optional<DType> dtype = std::nullopt);

// Every quantized Linear of `graph` replaced by its float weight (record and scale removed).
// Returns how many.
int64_t dequantize_quantized_linears(Graph& graph);

}  // namespace qforge
