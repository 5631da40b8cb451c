#include "runtime/int4_fusion.h"

#include <unordered_map>
#include <unordered_set>

#include "ir/error.h"
#include "kernels/int4.h"
#include "runtime/ops/matmul_nbits.h"

namespace qforge {

namespace {

bool default_domain(const Node& node) { return node.domain.empty() || node.domain == "ai.onnx"; }

int64_t default_opset(const Graph& g) {
  int64_t v = g.opset("");
  if (v == 0) v = g.opset("ai.onnx");
  return v == 0 ? 21 : v;  // Executor::kDefaultOpset
}

struct Rewrite {
  std::string weight, scales, zeros, bias;
  int64_t block_size = 0;
  bool round_f16 = false;
};

void make_int4_matmul(Node& node, const std::string& a, const Rewrite& r) {
  node.op_type = ops::kInt4MatMulOp;
  node.domain = ops::kInternalDomain;
  node.inputs = {a, r.weight, r.scales, r.zeros, r.bias};
  while (!node.inputs.empty() && node.inputs.back().empty()) node.inputs.pop_back();
  node.attributes.clear();
  node.set_attr(Attribute::make_int("block_size", r.block_size));
  node.set_attr(Attribute::make_int("round_f16", r.round_f16 ? 1 : 0));
}

// The int4 zero points of a blocked DequantizeLinear as Int4MatMul's int8 tensor.
Tensor widen_zero_points(const Tensor& zp) {
  Tensor out(DType::I8, zp.shape());
  auto o = out.mutable_data<int8_t>();
  unpack_int4(zp.data<uint8_t>(), o);
  return out;
}

}  // namespace

int fuse_int4_matmuls(Graph& graph) {
  std::unordered_set<std::string> graph_outputs;
  for (const auto& v : graph.outputs) graph_outputs.insert(v.name);
  const auto consumers = graph.consumers();
  const auto readers = [&](const std::string& value) -> const std::vector<size_t>& {
    static const std::vector<size_t> none;
    const auto it = consumers.find(value);
    return it == consumers.end() ? none : it->second;
  };
  // Only MatMul B inputs (never A) read `value`, and it is not a graph output.
  const auto only_matmul_b = [&](const std::string& value) {
    if (graph_outputs.count(value) || readers(value).empty()) return false;
    for (size_t c : readers(value)) {
      const Node& n = graph.nodes[c];
      if (!default_domain(n) || n.op_type != "MatMul" || n.inputs.size() != 2 ||
          n.inputs[0] == value || n.inputs[1] != value) {
        return false;
      }
    }
    return true;
  };

  std::vector<bool> drop(graph.nodes.size(), false);
  int fused = 0;
  const bool blocked_dq = default_opset(graph) >= 21;
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    Node& dq = graph.nodes[i];
    if (!blocked_dq || !default_domain(dq) || dq.op_type != "DequantizeLinear" ||
        dq.inputs.size() < 2 || dq.outputs.size() != 1) {
      continue;
    }
    const Tensor* q = graph.find_initializer(dq.inputs[0]);
    const Tensor* s = graph.find_initializer(dq.inputs[1]);
    const bool has_zp = dq.inputs.size() > 2 && !dq.inputs[2].empty();
    const Tensor* zp = has_zp ? graph.find_initializer(dq.inputs[2]) : nullptr;
    if (q == nullptr || s == nullptr || (has_zp && zp == nullptr)) continue;
    if (q->dtype() != DType::I4 || q->rank() != 2) continue;
    if (s->dtype() != DType::F16 && s->dtype() != DType::F32) continue;
    const int64_t axis = dq.attr_int("axis", 1);
    const int64_t bs = dq.attr_int("block_size", 0);
    const int64_t k = q->shape()[0], n = q->shape()[1];
    if ((axis != 0 && axis != -2) || bs <= 0) continue;
    if (s->shape() != Shape{int4_block_count(k, bs), n}) continue;
    if (zp != nullptr && (zp->dtype() != DType::I4 || zp->shape() != s->shape())) continue;
    const int64_t out_dtype = dq.attr_int("output_dtype", 0);
    if (out_dtype != 0 && dtype_from_onnx(static_cast<int>(out_dtype)) != s->dtype()) continue;

    Rewrite r;
    r.weight = dq.inputs[0];
    r.scales = dq.inputs[1];
    r.block_size = bs;
    r.round_f16 = s->dtype() == DType::F16;
    std::string b_value = dq.outputs[0];
    size_t cast_index = graph.nodes.size();
    if (!only_matmul_b(b_value)) {
      // DequantizeLinear -> Cast -> MatMul(s).
      const auto& rd = readers(b_value);
      if (graph_outputs.count(b_value) || rd.size() != 1) continue;
      const Node& cast = graph.nodes[rd[0]];
      if (!default_domain(cast) || cast.op_type != "Cast" || cast.outputs.size() != 1) continue;
      const auto to = dtype_from_onnx(static_cast<int>(cast.attr_int("to", 0)));
      if (to != DType::F32 && to != DType::F16) continue;
      if (!only_matmul_b(cast.outputs[0])) continue;
      r.round_f16 = r.round_f16 || to == DType::F16;
      cast_index = rd[0];
      b_value = cast.outputs[0];
    }
    if (zp != nullptr) {
      r.zeros = graph.unique_name(dq.inputs[2] + "_i8");
      graph.set_initializer(r.zeros, widen_zero_points(*zp));
    }
    for (size_t c : readers(b_value)) {
      Node& mm = graph.nodes[c];
      make_int4_matmul(mm, mm.inputs[0], r);
      ++fused;
    }
    drop[i] = true;
    if (cast_index < graph.nodes.size()) drop[cast_index] = true;
  }

  // MatMulNBits with constant weights: repack once.
  for (Node& node : graph.nodes) {
    if (node.domain != "com.microsoft" || node.op_type != "MatMulNBits" || node.inputs.size() < 3)
      continue;
    if (node.attr_int("bits", 4) != 4) continue;
    const auto input = [&](size_t i) { return i < node.inputs.size() ? node.inputs[i] : std::string(); };
    if (!input(4).empty()) continue;  // g_idx: left to the op, which reports it
    const Tensor* b = graph.find_initializer(input(1));
    const Tensor* s = graph.find_initializer(input(2));
    const Tensor* zp = input(3).empty() ? nullptr : graph.find_initializer(input(3));
    if (b == nullptr || s == nullptr || (!input(3).empty() && zp == nullptr)) continue;
    if (zp != nullptr && zp->dtype() != DType::U8) continue;
    const int64_t k = node.attr_int("K", 0), n = node.attr_int("N", 0);
    const int64_t bs = node.attr_int("block_size", 0);
    if (k <= 0 || n <= 0 || bs <= 0) continue;  // the op reports it
    ops::RepackedNBits rp = ops::repack_matmulnbits(node.label(), *b, *s, zp, k, n, bs);
    Rewrite r;
    r.block_size = bs;
    r.bias = input(5);
    r.weight = graph.unique_name(input(1) + "_int4");
    graph.set_initializer(r.weight, std::move(rp.packed));
    r.scales = graph.unique_name(input(2) + "_blocks");
    graph.set_initializer(r.scales, std::move(rp.scales));
    if (!rp.zeros.empty()) {
      r.zeros = graph.unique_name(input(3) + "_i8");
      graph.set_initializer(r.zeros, std::move(rp.zeros));
    }
    make_int4_matmul(node, node.inputs[0], r);
    ++fused;
  }

  std::vector<Node> kept;
  kept.reserve(graph.nodes.size());
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    if (!drop[i]) kept.push_back(std::move(graph.nodes[i]));
  }
  graph.nodes = std::move(kept);
  return fused;
}

}  // namespace qforge
