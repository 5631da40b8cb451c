#pragma once
// Graph builders and checks shared by the static INT8, clean-up and BatchNorm folding tests.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "quant/static/static_int8.h"
#include "tests/unit/quant/weights/weight_int8_fixtures.h"

namespace qforge::test {

inline PassReport run_static(Graph& g, StaticInt8Options options) {
  options.device = Device::Cpu;
  PassReport report;
  report.pass = "static-int8";
  make_static_int8_pass(std::move(options))->run(g, report);
  return report;
}

inline PassReport run_static(Graph& g, std::map<std::string, float> ranges) {
  StaticInt8Options options;
  options.activation_amax = std::move(ranges);
  return run_static(g, std::move(options));
}

inline size_t count_ops(const Graph& g, const std::string& op) {
  return static_cast<size_t>(std::count_if(g.nodes.begin(), g.nodes.end(),
                                           [&](const Node& n) { return n.op_type == op; }));
}

inline bool has_warning(const PassReport& r, const std::string& text) {
  return std::any_of(r.warnings.begin(), r.warnings.end(),
                     [&](const std::string& w) { return w.find(text) != std::string::npos; });
}

// Input `slot` of node `consumer` must be DequantizeLinear(QuantizeLinear(activation)) with one
// shared scalar scale amax / 127 and a scalar int8 zero point 0, both produced before the reader.
inline void expect_activation_qdq(const Graph& g, const std::string& consumer, size_t slot,
                                  const std::string& activation, float amax) {
  SCOPED_TRACE(consumer + " input " + std::to_string(slot));
  const Node* user = find_node(g, consumer);
  ASSERT_NE(user, nullptr);
  ASSERT_LT(slot, user->inputs.size());
  size_t dq_at = 0, q_at = 0;
  const Node* dq = producer_of(g, user->inputs[slot], &dq_at);
  ASSERT_TRUE(dq && dq->op_type == "DequantizeLinear") << "reads " << user->inputs[slot];
  const Node* q = producer_of(g, dq->inputs[0], &q_at);
  ASSERT_TRUE(q && q->op_type == "QuantizeLinear");
  EXPECT_EQ(q->inputs[0], activation);
  EXPECT_LT(q_at, dq_at);
  EXPECT_LT(dq_at, node_index(g, consumer));
  EXPECT_EQ(q->inputs[1], dq->inputs[1]) << "Q and DQ share the scale";
  EXPECT_EQ(q->inputs[2], dq->inputs[2]) << "Q and DQ share the zero point";
  EXPECT_EQ(dq->attr("axis"), nullptr);
  const Tensor* scale = g.find_initializer(q->inputs[1]);
  const Tensor* zp = g.find_initializer(q->inputs[2]);
  ASSERT_TRUE(scale && zp);
  EXPECT_EQ(scale->dtype(), DType::F32);
  EXPECT_EQ(scale->shape(), Shape{});
  EXPECT_EQ(scale->data<float>()[0], amax / 127.0f);
  EXPECT_EQ(zp->dtype(), DType::I8);
  EXPECT_EQ(zp->shape(), Shape{});
  EXPECT_EQ(zp->data<int8_t>()[0], 0);
}

}  // namespace qforge::test
