#pragma once
// The table of ops the runtime executes: {domain, op_type, fn}. Each op family under
// runtime/ops/ contributes one slice of the table; lookup and the supported-op list read it.
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/op_context.h"

namespace qforge::ops {

// The domain of the ops the executor's planning steps put in place of subgraphs
// (runtime/int4_fusion.h, runtime/op_fusion.h); no model is expected to use it.
constexpr const char* kInternalDomain = "qforge.internal";

struct OpEntry {
  std::string_view domain;  // "" is the default ONNX domain ("ai.onnx" is accepted as alias)
  std::string_view op_type;
  OpFn fn;
};

// One slice per file under runtime/ops/.
std::span<const OpEntry> elementwise_ops();  // elementwise.cpp
std::span<const OpEntry> logic_ops();        // logic.cpp
std::span<const OpEntry> activation_ops();   // activation.cpp
std::span<const OpEntry> matmul_ops();       // matmul.cpp
std::span<const OpEntry> conv_ops();         // conv.cpp, conv_transpose.cpp
std::span<const OpEntry> pool_ops();         // pool.cpp
std::span<const OpEntry> norm_ops();         // norm.cpp
std::span<const OpEntry> shape_ops();        // shape.cpp
std::span<const OpEntry> tensor_ops();       // tensor.cpp
std::span<const OpEntry> reduce_ops();       // reduce.cpp
std::span<const OpEntry> quantize_ops();     // quantize.cpp

// The implementation of (domain, op_type), or nullptr.
OpFn find_op(std::string_view domain, std::string_view op_type);
// "Add", "Conv", ... (domain-qualified outside the default domain), sorted.
std::vector<std::string> registered_ops();

}  // namespace qforge::ops
