#pragma once
// Graph builders and checks shared by the weight-int8 pass tests.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "ir/pass.h"
#include "quant/weights/weight_int8.h"

namespace qforge::test {

inline std::vector<float> random_values(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 0.5f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

inline Tensor random_weight(const Shape& shape, uint32_t seed, DType dtype = DType::F32) {
  return Tensor::from_f32(random_values(shape_numel(shape), seed), shape, dtype);
}

inline Node make_node(std::string name, std::string op, std::vector<std::string> in,
                      std::vector<std::string> out, std::vector<Attribute> attrs = {}) {
  Node n;
  n.name = std::move(name);
  n.op_type = std::move(op);
  n.inputs = std::move(in);
  n.outputs = std::move(out);
  n.attributes = std::move(attrs);
  return n;
}

// x -> <op>(x, w [, b]) -> y, at opset 11.
inline Graph single_op(const std::string& op, const Tensor& w, std::vector<Attribute> attrs = {}) {
  Graph g;
  g.set_opset("", 11);
  g.inputs.push_back({.name = "x", .dtype = w.dtype()});
  g.set_initializer("w", w);
  g.nodes.push_back(make_node(op + "_0", op, {"x", "w"}, {"y"}, std::move(attrs)));
  g.outputs.push_back({.name = "y"});
  return g;
}

inline PassReport run_pass(Graph& g, WeightInt8Options options = {}) {
  options.device = Device::Cpu;
  PassReport report;
  report.pass = "weight-int8";
  make_weight_int8_pass(std::move(options))->run(g, report);
  return report;
}

inline const Node* find_node(const Graph& g, const std::string& name) {
  for (const Node& n : g.nodes)
    if (n.name == name) return &n;
  return nullptr;
}

inline const Node* producer_of(const Graph& g, const std::string& value, size_t* index = nullptr) {
  for (size_t i = 0; i < g.nodes.size(); ++i)
    for (const auto& o : g.nodes[i].outputs)
      if (o == value) {
        if (index) *index = i;
        return &g.nodes[i];
      }
  return nullptr;
}

inline size_t node_index(const Graph& g, const std::string& name) {
  for (size_t i = 0; i < g.nodes.size(); ++i)
    if (g.nodes[i].name == name) return i;
  return g.nodes.size();
}

// Checks that input `input` of node `consumer` is DequantizeLinear (behind a Cast to the weight's
// dtype for f16/bf16) of an int8 symmetric quantization of `original` along `axis`, computed
// here from scratch: scale = amax(slice) / 127 (1 for an all-zero slice), q = clamp(round half
// even(x / scale)), zero point 0, and the dequantized weight within scale / 2 of `original`.
// Returns the DequantizeLinear node.
inline const Node* expect_quantized(const Graph& g, const std::string& consumer, size_t input,
                                    const std::vector<float>& original, const Shape& shape,
                                    std::optional<int64_t> axis, DType dtype = DType::F32) {
  const Node* user = find_node(g, consumer);
  EXPECT_NE(user, nullptr) << consumer;
  if (user == nullptr) return nullptr;
  size_t at = 0;
  const Node* dq = producer_of(g, user->inputs[input], &at);
  EXPECT_LT(at, node_index(g, consumer)) << "dequantized weight produced after its consumer";
  if (dtype != DType::F32) {
    EXPECT_TRUE(dq && dq->op_type == "Cast") << "f16/bf16 weight needs a Cast after DQ";
    if (!dq || dq->op_type != "Cast") return nullptr;
    EXPECT_EQ(dq->attr_int("to", -1), dtype_to_onnx(dtype));
    dq = producer_of(g, dq->inputs[0]);
  }
  EXPECT_TRUE(dq && dq->op_type == "DequantizeLinear");
  if (!dq || dq->op_type != "DequantizeLinear" || dq->inputs.size() != 3) return nullptr;
  const Attribute* axis_attr = dq->attr("axis");
  if (axis) {
    EXPECT_TRUE(axis_attr && axis_attr->i == *axis) << "axis attribute";
  } else {
    EXPECT_EQ(axis_attr, nullptr) << "per-tensor DQ must not carry an axis";
  }
  const Tensor* q = g.find_initializer(dq->inputs[0]);
  const Tensor* scale = g.find_initializer(dq->inputs[1]);
  const Tensor* zp = g.find_initializer(dq->inputs[2]);
  EXPECT_TRUE(q && scale && zp) << "DQ inputs must be initializers";
  if (!q || !scale || !zp) return nullptr;
  EXPECT_EQ(q->dtype(), DType::I8);
  EXPECT_EQ(q->shape(), shape);
  EXPECT_EQ(scale->dtype(), DType::F32);
  EXPECT_EQ(zp->dtype(), DType::I8);
  const Shape scale_shape = axis ? Shape{shape[static_cast<size_t>(*axis)]} : Shape{};
  EXPECT_EQ(scale->shape(), scale_shape);
  EXPECT_EQ(zp->shape(), scale_shape);
  for (int8_t z : zp->data<int8_t>()) EXPECT_EQ(z, 0);

  // Channel of flat index k along `axis` in row-major order.
  int64_t stride = 1;
  if (axis)
    for (size_t d = static_cast<size_t>(*axis) + 1; d < shape.size(); ++d) stride *= shape[d];
  const int64_t channels = axis ? shape[static_cast<size_t>(*axis)] : 1;
  auto channel = [&](size_t k) { return axis ? (static_cast<int64_t>(k) / stride) % channels : 0; };
  std::vector<float> amax(static_cast<size_t>(channels), 0.0f);
  for (size_t k = 0; k < original.size(); ++k)
    amax[channel(k)] = std::max(amax[channel(k)], std::fabs(original[k]));
  const auto scales = scale->data<float>();
  for (int64_t c = 0; c < channels; ++c) {
    const float expected = amax[c] > 0 ? amax[c] / 127.0f : 1.0f;
    EXPECT_EQ(scales[c], expected) << "scale of channel " << c;
  }
  const auto qs = q->data<int8_t>();
  for (size_t k = 0; k < original.size(); ++k) {
    const float s = scales[channel(k)];
    const float r = std::min(127.0f, std::max(-127.0f, std::nearbyint(original[k] / s)));
    EXPECT_EQ(qs[k], static_cast<int8_t>(r)) << "q[" << k << "]";
    EXPECT_LE(std::fabs(qs[k] * s - original[k]), s * 0.5f * (1 + 1e-5f)) << "element " << k;
  }
  return dq;
}

}  // namespace qforge::test
