#include "runtime/half_compute.h"

#include <algorithm>
#include <optional>
#include <unordered_set>

#include "runtime/op_utils.h"

namespace qforge {

namespace {

bool in_default_domain(const Node& n) { return n.domain.empty() || n.domain == "ai.onnx"; }

}  // namespace

// Ops that ONNX Runtime's CPU provider (1.31, x86) runs with an fp16 kernel: their fp16 inputs
// and outputs stay 16-bit there. Probed one op at a time with an fp16 input, reading the
// optimized model ORT saves (no InsertedCast around the node). Every other op with an fp16
// input runs in f32 between Casts that ORT inserts.
bool ort_has_fp16_cpu_kernel(const Node& n) {
  static const std::unordered_set<std::string> kDefault = {"Cast",
                                                           "CastLike",
                                                           "Identity",
                                                           "Round",
                                                           "Sign",
                                                           "IsNaN",
                                                           "Max",
                                                           "Min",
                                                           "Clip",
                                                           "Transpose",
                                                           "Reshape",
                                                           "Unsqueeze",
                                                           "Squeeze",
                                                           "Flatten",
                                                           "Concat",
                                                           "Split",
                                                           "Slice",
                                                           "Gather",
                                                           "Expand",
                                                           "Shape",
                                                           "Size",
                                                           "LayerNormalization",
                                                           "DequantizeLinear",
                                                           "QuantizeLinear",
                                                           "ConstantOfShape"};
  static const std::unordered_set<std::string> kMicrosoft = {"MatMulNBits",
                                                             "SkipLayerNormalization"};
  if (in_default_domain(n)) return kDefault.count(n.op_type) > 0;
  if (n.domain == "com.microsoft") return kMicrosoft.count(n.op_type) > 0;
  return false;
}

// Declared element type of the values of `g` as far as the planning needs it (is it f16/bf16):
// from the graph's inputs, outputs, value_info and initializers, then per node by the op's rule
// (the type of its first float input for most ops).
std::unordered_map<std::string, DType> declared_value_dtypes(const Graph& g) {
  std::unordered_map<std::string, DType> t;
  for (const auto& [name, tensor] : g.initializers()) t[name] = tensor.dtype();
  for (const auto* list : {&g.inputs, &g.outputs, &g.value_info}) {
    for (const auto& v : *list) {
      if (v.dtype) t[v.name] = *v.dtype;
    }
  }
  static const std::unordered_set<std::string> kI64 = {"Shape", "Size", "NonZero", "ArgMax",
                                                       "ArgMin"};
  static const std::unordered_set<std::string> kBool = {
      "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "Not",
      "And",   "Or",   "Xor",     "IsNaN",       "IsInf"};
  const auto in = [&](const Node& n, size_t i) -> std::optional<DType> {
    if (i >= n.inputs.size()) return std::nullopt;
    const auto it = t.find(n.inputs[i]);
    return it == t.end() ? std::nullopt : std::optional(it->second);
  };
  for (const Node& n : g.nodes) {
    std::optional<DType> d;
    if (in_default_domain(n)) {
      if (n.op_type == "Cast") {
        d = dtype_from_onnx(static_cast<int>(n.attr_int("to", 0)));
      } else if (n.op_type == "CastLike" || n.op_type == "DequantizeLinear" ||
                 n.op_type == "Where") {
        d = in(n, 1);  // the type of input 1 (CastLike's target, the scale, a branch)
      } else if (kI64.count(n.op_type)) {
        d = DType::I64;
      } else if (kBool.count(n.op_type)) {
        d = DType::Bool;
      } else if (n.op_type == "Constant" || n.op_type == "ConstantOfShape") {
        const Attribute* a = n.attr("value");
        if (a != nullptr && a->type == AttrType::Tensor) d = a->t.dtype();
      }
    }
    if (!d && !(in_default_domain(n) && n.op_type == "QuantizeLinear")) {
      for (size_t i = 0; i < n.inputs.size() && !d; ++i) {
        const auto x = in(n, i);
        if (x && (*x == DType::F32 || *x == DType::F64 || ops::is_half(*x))) d = x;
      }
    }
    if (!d) continue;
    for (const auto& out : n.outputs) {
      if (!out.empty()) t.emplace(out, *d);
    }
  }
  return t;
}

std::unordered_map<std::string, OrtHalfDecision> ort_half_decisions(
    const Graph& g, const std::unordered_map<std::string, DType>& dtype) {
  const auto half = [&](const std::string& v) {
    const auto it = dtype.find(v);
    return !v.empty() && it != dtype.end() && ops::is_half(it->second);
  };
  const auto producers = g.producers();
  const auto consumers = g.consumers();
  std::unordered_set<std::string> outputs;
  for (const auto& o : g.outputs) outputs.insert(o.name);
  const size_t n = g.nodes.size();
  // ORT: a node with an fp16 input and no fp16 kernel gets Casts to f32 inserted around it.
  std::vector<bool> assigned(n), needs_cast(n);
  const auto has_half_input = [&](const Node& node) {
    return std::any_of(node.inputs.begin(), node.inputs.end(), half);
  };
  for (size_t i = 0; i < n; ++i) {
    assigned[i] = ort_has_fp16_cpu_kernel(g.nodes[i]);
    needs_cast[i] = !assigned[i] && has_half_input(g.nodes[i]);
  }
  // ForceSingleNodeCPUFloat16ToFloat32 (IsIsolatedFp16NodeOnCpu): a node with an fp16 kernel
  // is run in f32 too when it reads some value made by another node, makes no graph output,
  // has an fp16 input and an fp16 output, every fp16 input made by a node comes from one that
  // needs Casts, and every reader of its fp16 outputs needs Casts (initializers and graph
  // inputs are simply cast). Nodes are visited in order and a forced node counts as needing
  // Casts for the nodes after it, as in ORT.
  for (size_t i = 0; i < n; ++i) {
    const Node& node = g.nodes[i];
    if (!assigned[i]) continue;
    bool has_input_edge = false, reads_half = false, inputs_casted = true;
    for (const auto& in : node.inputs) {
      if (in.empty()) continue;
      const auto p = producers.find(in);
      if (p != producers.end()) has_input_edge = true;
      if (!half(in)) continue;
      reads_half = true;
      if (p != producers.end() && !needs_cast[p->second]) inputs_casted = false;
    }
    bool feeds_output = false, has_half_output = false, outputs_casted = true;
    for (const auto& out : node.outputs) {
      if (out.empty()) continue;
      if (outputs.count(out)) feeds_output = true;
      if (!half(out)) continue;
      has_half_output = true;
      const auto c = consumers.find(out);
      if (c == consumers.end()) continue;
      for (size_t r : c->second) {
        if (!needs_cast[r]) outputs_casted = false;
      }
    }
    if (has_input_edge && !feeds_output && reads_half && inputs_casted && has_half_output &&
        outputs_casted) {
      assigned[i] = false;
      needs_cast[i] = true;
    }
  }
  std::unordered_map<std::string, OrtHalfDecision> out;
  for (size_t i = 0; i < n; ++i) {
    const Node& node = g.nodes[i];
    if (node.outputs.empty()) continue;
    OrtHalfDecision d;
    d.wide = needs_cast[i];
    // A model Cast between f32 and 16 bits next to a Cast that ORT inserted: the pair is
    // removed (both are of the float type group), so no rounding happens there. Cast(f32 ->
    // 16 bits): the Casts inserted before the f32-computing readers of its output cancel it,
    // those readers see the f32 input (other readers and a graph output still get it rounded).
    // Cast(16 bits -> f32) of a value an f32-computing node made: it cancels the Cast inserted
    // after that node, unless its output is a graph output.
    if (in_default_domain(node) && node.op_type == "Cast" && node.inputs.size() == 1) {
      const auto src = dtype.find(node.inputs[0]);
      const auto dst = dtype.find(node.outputs[0]);
      if (src != dtype.end() && dst != dtype.end()) {
        if (src->second == DType::F32 && ops::is_half(dst->second)) d.wide = d.fold = true;
        const auto p = producers.find(node.inputs[0]);
        if (ops::is_half(src->second) && dst->second == DType::F32 && p != producers.end() &&
            needs_cast[p->second] && !outputs.count(node.outputs[0])) {
          d.wide = d.fold = true;
        }
      }
    }
    out.emplace(node.outputs[0], d);
  }
  return out;
}

}  // namespace qforge
