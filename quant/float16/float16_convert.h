#pragma once
// Float16 conversion: a float32 graph's activations and float weights become fp16 or bf16
// (the activation dtype of W4A16), with numerically fragile ops kept in fp32 behind Casts.
//
// What changes:
//  - every f32 value produced by a converted node becomes the activation dtype; f32
//    initializers read by converted nodes are rounded once (nearest even; finite values past
//    the type's range saturate to its largest finite value, as ONNX Runtime's converter
//    clamps, so a -FLT_MAX attention-mask constant stays finite); Constant and
//    ConstantOfShape values and Cast targets (`to` = float) follow.
//  - nodes whose op type is in `keep_fp32_ops` (LayerNormalization, Softmax, reductions, Pow,
//    Sqrt... see default_keep_fp32_ops()), the output projection and embedding Gathers (see
//    below), ops that cannot run in 16 bits (Range, NonMaxSuppression, ops with a `dtype`
//    attribute, other domains than ONNX's and com.microsoft MatMulNBits) run in f32: Casts to
//    f32 in front of their float inputs and to the activation dtype behind their outputs. An
//    initializer read both by kept and by converted nodes keeps its f32 original beside the
//    converted copy.
//  - graph I/O: with keep_io_types (the default, as ONNX Runtime's float16 converter's
//    `keep_io_types=True` and what users of ORT/ModelOpt expect) float32 inputs and outputs
//    keep their type, with a Cast at the boundary; without it they take the activation dtype.
//  - f64 and existing f16/bf16 values, integer and bool values are never touched.
//  - Casts that became no-ops (DequantizeLinear's fp16 -> Cast(to f32) -> fp16) and lossless
//    round trips (f16 -> f32 -> f16) are removed.
// Graphs with subgraphs (If, Loop, Scan) are refused (Unsupported).
#include <memory>
#include <string>
#include <vector>

#include "ir/pass.h"

namespace qforge {

// Special entries of keep_fp32_ops, besides op types.
inline constexpr std::string_view kKeepOutputProjection = "output-projection";
inline constexpr std::string_view kKeepEmbeddings = "embeddings";

struct Float16ConvertOptions {
  DType act_dtype = DType::F16;            // F16 or BF16
  std::vector<std::string> keep_fp32_ops;  // op types, kKeepOutputProjection, kKeepEmbeddings
  bool keep_io_types = true;
};

// LayerNormalization, Softmax, LogSoftmax, the reductions, Pow, Sqrt and Exp (overflow of
// x^2 and exp(x) in fp16), plus the output projection and the embeddings.
std::vector<std::string> default_keep_fp32_ops();

// Throws Usage for an act_dtype other than F16/BF16.
std::unique_ptr<Pass> make_float16_convert_pass(Float16ConvertOptions options);

}  // namespace qforge
