#include "importers/onnx/onnx_quant_records.h"

#include <unordered_map>
#include <unordered_set>

namespace qforge {

namespace {

const std::string& input_or_empty(const Node& node, size_t i) {
  static const std::string kNone;
  return i < node.inputs.size() ? node.inputs[i] : kNone;
}

QuantRecord from_dequantize(const Graph& graph, const Node& dq,
                            const std::unordered_map<std::string, size_t>& producers) {
  QuantRecord r;
  r.name = dq.inputs[0];
  r.scale = dq.inputs[1];
  r.zero_point = input_or_empty(dq, 2);
  r.reader = dq.outputs.empty() ? std::string() : dq.outputs[0];
  const Tensor* x = graph.find_initializer(r.name);
  const Tensor* scale = graph.find_initializer(r.scale);
  const Tensor* zp = r.zero_point.empty() ? nullptr : graph.find_initializer(r.zero_point);
  if (x != nullptr) {
    r.kind = QuantKind::Weight;
    r.source = r.reader;
    r.dtype = x->dtype();
  } else {
    r.kind = QuantKind::Activation;
    r.source = r.name;
    const auto p = producers.find(r.name);
    if (p != producers.end()) {
      const Node& q = graph.nodes[p->second];
      if (q.op_type == "QuantizeLinear" && q.domain.empty() && !q.inputs.empty()) {
        r.source = q.inputs[0];
      }
    }
    if (zp != nullptr) {
      r.dtype = zp->dtype();
    } else if (r.zero_point.empty()) {
      r.dtype = DType::U8;  // ONNX's type for QuantizeLinear without a zero point
    }
  }
  r.bits = r.dtype ? dtype_bits(*r.dtype) : 0;
  int64_t axis = dq.attr_int("axis", 1);
  if (axis < 0 && x != nullptr) axis += static_cast<int64_t>(x->rank());
  r.block_size = dq.attr_int("block_size", 0);
  const bool scalar_scale = scale == nullptr || scale->rank() == 0;
  if (r.block_size > 0 || !scalar_scale) r.axis = axis;
  return r;
}

QuantRecord from_matmulnbits(const Node& node) {
  QuantRecord r;
  r.kind = QuantKind::Weight;
  r.name = node.inputs[1];
  r.source = r.name;
  r.packing = QuantPacking::MatMulNBits;
  r.bits = static_cast<int>(node.attr_int("bits", 4));
  if (r.bits == 4) r.dtype = DType::U4;
  if (r.bits == 8) r.dtype = DType::U8;
  r.axis = 0;  // blocks run along K of the logical B[K, N]
  r.block_size = node.attr_int("block_size", 0);
  r.scale = input_or_empty(node, 2);
  r.zero_point = input_or_empty(node, 3);
  r.reader = node.outputs.empty() ? std::string() : node.outputs[0];
  return r;
}

}  // namespace

std::vector<QuantRecord> onnx_quant_records(const Graph& graph) {
  const auto producers = graph.producers();
  std::vector<QuantRecord> records;
  std::unordered_set<std::string> seen;
  for (const Node& node : graph.nodes) {
    if (node.outputs.empty() || node.outputs[0].empty()) continue;
    // The ONNX domain spelled "" only, as qforge's writers have always listed these tensors.
    if (node.op_type == "DequantizeLinear" && node.domain.empty() && node.inputs.size() >= 2 &&
        !node.inputs[0].empty()) {
      if (seen.insert(node.inputs[0]).second)
        records.push_back(from_dequantize(graph, node, producers));
    } else if (node.op_type == "MatMulNBits" && node.domain == "com.microsoft" &&
               node.inputs.size() >= 3 && graph.has_initializer(node.inputs[1])) {
      if (seen.insert(node.inputs[1]).second) records.push_back(from_matmulnbits(node));
    }
  }
  return records;
}

}  // namespace qforge
