#pragma once
// Checks shared by the tests of the quantized-tensor records the passes attach: a record
// against the nodes and initializers its pass wrote.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "ir/graph.h"

namespace qforge::test::records {

inline const Node* node_producing(const Graph& g, const std::string& value) {
  for (const Node& n : g.nodes)
    if (!n.outputs.empty() && n.outputs[0] == value) return &n;
  return nullptr;
}

inline const QuantRecord& record_of(const Graph& g, const std::string& name) {
  const QuantRecord* r = g.find_quant_record(name);
  if (r == nullptr) {
    ADD_FAILURE() << "no record for '" << name << "'";
    static const QuantRecord kNone;
    return kNone;
  }
  return *r;
}

// `record` is read by the DequantizeLinear that produces its reader value, which reads exactly
// its tensors, with its axis and block size; the scale and zero point have `scale_shape`.
inline void expect_dequantize_record(const Graph& g, const QuantRecord& record,
                                     const Shape& scale_shape) {
  SCOPED_TRACE("record '" + record.name + "'");
  EXPECT_EQ(record.packing, QuantPacking::Onnx);
  const Node* dq = node_producing(g, record.reader);
  ASSERT_NE(dq, nullptr);
  EXPECT_EQ(dq->op_type, "DequantizeLinear");
  std::vector<std::string> inputs = {record.name, record.scale};
  if (!record.zero_point.empty()) inputs.push_back(record.zero_point);
  EXPECT_EQ(dq->inputs, inputs);
  EXPECT_EQ(dq->attr("axis") != nullptr, record.axis.has_value());
  if (record.axis) {
    EXPECT_EQ(dq->attr_int("axis", -1), *record.axis);
  }
  EXPECT_EQ(dq->attr_int("block_size", 0), record.block_size);
  ASSERT_NE(g.find_initializer(record.scale), nullptr);
  EXPECT_EQ(g.find_initializer(record.scale)->shape(), scale_shape);
  if (!record.zero_point.empty()) {
    ASSERT_NE(g.find_initializer(record.zero_point), nullptr);
    EXPECT_EQ(g.find_initializer(record.zero_point)->shape(), scale_shape);
    EXPECT_EQ(g.find_initializer(record.zero_point)->dtype(), record.dtype);
  }
  if (record.kind == QuantKind::Weight) {
    ASSERT_NE(g.find_initializer(record.name), nullptr);
    EXPECT_EQ(g.find_initializer(record.name)->dtype(), record.dtype);
  }
  ASSERT_TRUE(record.dtype);
  EXPECT_EQ(record.bits, dtype_bits(*record.dtype));
  EXPECT_NO_THROW(g.check_quant_records());
}

// The value node `layer` reads at `slot` is `record`'s reader, directly or through one Cast.
inline void expect_feeds(const Graph& g, const QuantRecord& record, const std::string& layer,
                         size_t slot) {
  SCOPED_TRACE("record '" + record.name + "' feeding '" + layer + "'");
  const Node* node = nullptr;
  for (const Node& n : g.nodes)
    if (n.name == layer) node = &n;
  ASSERT_NE(node, nullptr);
  ASSERT_LT(slot, node->inputs.size());
  std::string value = node->inputs[slot];
  const Node* cast = node_producing(g, value);
  if (cast != nullptr && cast->op_type == "Cast") value = cast->inputs[0];
  EXPECT_EQ(value, record.reader);
}

}  // namespace qforge::test::records
