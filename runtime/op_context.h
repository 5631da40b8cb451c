#pragma once
// What an op implementation sees: its node, the opset of the node's domain, its input tensors
// and the slots for its outputs. Ops are plain functions registered in one table
// (op_registry.h); every error they raise names the op and node through this context.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ir/graph.h"

namespace qforge {
class PackedMatrix;
class PackedRows;
}  // namespace qforge

namespace qforge::ops {

class OpContext {
 public:
  OpContext(const Node& node, size_t node_index, int64_t opset, int threads)
      : node_(node), node_index_(node_index), opset_(opset), threads_(threads) {}

  const Node& node() const { return node_; }
  // A context for the same node with no inputs or outputs yet, for ops built from other ops.
  OpContext derived() const { return {node_, node_index_, opset_, threads_}; }
  int64_t opset() const { return opset_; }
  int threads() const { return threads_; }

  // Inputs: nullptr marks an absent optional input (empty name or past the end).
  std::vector<const Tensor*> inputs;
  size_t num_inputs() const { return inputs.size(); }
  bool has_input(size_t i) const { return i < inputs.size() && inputs[i] != nullptr; }
  // The input, or InvalidInput "op 'X' (node 'n') needs input i (name)" when absent.
  const Tensor& input(size_t i) const;

  // Per input: the value's slot where this op is its last reader (the executor drops the
  // value once the op has run, and no graph output is it), null elsewhere. An op may write its
  // output over such an input where sole_writable_bytes (op_utils.h) allows.
  std::vector<Tensor*> consumed;
  Tensor* consumed_input(size_t i) const { return i < consumed.size() ? consumed[i] : nullptr; }

  // MatMul and Gemm: their constant weight (input 1) packed when the executor was built
  // (pack_constant_weight in runtime/ops/matmul.h), or null.
  const PackedMatrix* packed_weight = nullptr;
  // Conv: its constant weight packed when the executor was built (pack_conv_weight in
  // runtime/ops/conv.h), or null.
  const PackedRows* packed_rows = nullptr;

  // Outputs: one slot per node output. An op fills every output it is asked for.
  std::vector<Tensor> outputs;
  bool wants_output(size_t i) const;
  void set_output(size_t i, Tensor t);

  // Attributes with defaults; a present attribute of the wrong type is InvalidInput.
  const Attribute* attr(std::string_view name) const { return node_.attr(name); }
  int64_t attr_int(std::string_view name, int64_t fallback) const;
  float attr_float(std::string_view name, float fallback) const;
  std::string attr_string(std::string_view name, std::string_view fallback) const;
  std::optional<std::vector<int64_t>> attr_ints(std::string_view name) const;
  std::optional<std::vector<float>> attr_floats(std::string_view name) const;
  const Tensor* attr_tensor(std::string_view name) const;

  // "op 'Conv' (node 'conv1')"; unnamed nodes are "(node #3)".
  std::string label() const;
  [[noreturn]] void fail_invalid(const std::string& what) const;
  [[noreturn]] void fail_unsupported(const std::string& what) const;
  // Unsupported: "op 'X' (node 'n'): input 0 'a' has dtype f64, which the qforge runtime does
  // not support for this op".
  [[noreturn]] void fail_dtype(size_t input_index) const;
  [[noreturn]] void fail_dtype_of(const std::string& what, DType dtype) const;

 private:
  const Attribute* typed_attr(std::string_view name, AttrType type) const;

  const Node& node_;
  size_t node_index_;
  int64_t opset_;
  int threads_;
};

using OpFn = void (*)(OpContext&);

}  // namespace qforge::ops
