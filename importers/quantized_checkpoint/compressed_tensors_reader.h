#pragma once
// Reads compressed-tensors `pack-quantized` checkpoints (../shared/REFERENCE.md 3.1; the layout
// exporters/compressed_tensors/compressed_tensors_writer.h writes): for each module M with
//   M.weight_packed  int32 [N, ceil(K * bits / 32)], q + 2^(bits - 1) packed along K, low first
//   M.weight_scale   float [N, K / group] (strategy group) or [N, 1] / [N] (strategy channel)
//   M.weight_shape   int64 (or int32) [2] = (N, K)
// the graph gets M.weight (i4 or i8 [N, K]) and M.weight_scale's values as M.weight_scale
// (ir/quantized_linear.h), with the config group whose targets match M deciding bits and group
// size (exact module name, then "re:" regex, then the class name "Linear", as
// compressed-tensors ranks matches). Symmetric int weights only, 4 or 8 bits, no activation
// quantization.
//
// Every disagreement between config.json and the tensors is InvalidInput naming the tensor:
// a missing weight_scale or weight_shape, a packed width, scale shape or dtype that does not
// follow from weight_shape and the group's bits and group size, a zero point under a symmetric
// config, a module both packed and stored float, or listed in `ignore` yet packed, a scale or
// shape tensor without its weight_packed. Schemes qforge does not read (asymmetric, float
// types, act-order g_idx, input activations, formats other than pack-quantized, a status other
// than compressed) are Unsupported, named.
#include <string>

#include "importers/quantized_checkpoint/quantized_checkpoint.h"
#include "ir/graph.h"

namespace qforge {

inline constexpr std::string_view kCompressedTensorsMethod = "compressed-tensors";

QuantizedCheckpoint read_compressed_tensors(const std::string& config_text,
                                            const std::string& file, Graph& graph);

}  // namespace qforge
