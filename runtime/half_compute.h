#pragma once
// HalfCompute::Ort planning for the Executor (runtime/executor.cpp): which nodes ONNX Runtime's
// CPU provider runs in f32 on an fp16 graph, as its InsertCastTransformer and
// RemoveDuplicateCastTransformer decide (onnxruntime/core/optimizer/insert_cast_transformer.cc).
#include <string>
#include <unordered_map>

#include "ir/graph.h"

namespace qforge {

// Whether ORT's CPU provider (1.31, x86) has an fp16 kernel for `node`'s op.
bool ort_has_fp16_cpu_kernel(const Node& node);

// Declared element type of the values of `g` as far as the planning needs it (is it f16/bf16):
// from the graph's inputs, outputs, value_info and initializers, then per node by the op's rule
// (the type of its first float input for most ops).
std::unordered_map<std::string, DType> declared_value_dtypes(const Graph& g);

struct OrtHalfDecision {
  bool wide = false;  // ORT runs it in f32: fp16 inputs widened, outputs left f32
  bool fold = false;  // a model Cast that ORT's RemoveDuplicateCastTransformer removes
};
// Per node of `g` (the graph as written, before the int4 fusion), keyed by its first output.
std::unordered_map<std::string, OrtHalfDecision> ort_half_decisions(
    const Graph& g, const std::unordered_map<std::string, DType>& dtype);

}  // namespace qforge
