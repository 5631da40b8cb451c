#pragma once
// Graph builders and an independent reference for the W4A16 pass tests.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "ir/half.h"
#include "ir/pass.h"
#include "quant/w4a16/w4a16.h"
#include "runtime/executor.h"

namespace qforge::test::w4a16 {

inline Tensor random_weight(const Shape& shape, uint32_t seed, DType dtype = DType::F32) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 0.5f);
  std::vector<float> v(shape_numel(shape));
  for (float& x : v) x = dist(rng);
  return Tensor::from_f32(v, shape, dtype);
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

// x -> MatMul(w1) -> Relu -> MatMul(w2) -> y, at opset 17.
inline Graph mlp(int64_t k, int64_t hidden, int64_t n, uint32_t seed = 1) {
  Graph g;
  g.name = "mlp";
  g.set_opset("", 17);
  const Dim batch{.param = "batch"};
  g.inputs.push_back(
      {.name = "x", .dtype = DType::F32, .shape = std::vector<Dim>{batch, Dim{.value = k}}});
  g.set_initializer("w1", random_weight({k, hidden}, seed));
  g.set_initializer("w2", random_weight({hidden, n}, seed + 1));
  g.nodes.push_back(make_node("fc1", "MatMul", {"x", "w1"}, {"h"}));
  g.nodes.push_back(make_node("act", "Relu", {"h"}, {"a"}));
  g.nodes.push_back(make_node("fc2", "MatMul", {"a", "w2"}, {"y"}));
  g.outputs.push_back(
      {.name = "y", .dtype = DType::F32, .shape = std::vector<Dim>{batch, Dim{.value = n}}});
  return g;
}

inline PassReport run_pass(Graph& g, W4A16Options options = {}) {
  options.device = Device::Cpu;
  PassReport report;
  report.pass = "w4a16";
  make_w4a16_pass(std::move(options))->run(g, report);
  return report;
}

// What the quantized weight dequantizes to in the graph: fp16(q * fp16(amax / 7)) per block
// along `axis` of a 2-D weight, written from the rules rather than from the kernels.
// The block scale per kernels/int4.h, written from the contract: amax / 7, or (Mse) the first
// of the candidates +-fp16(amax * c / 7), +-fp16(amax / 8) with the least sum of (w - s * q)^2
// (each difference in float, summed in double), then up to two least-squares refinements
// fp16(sum(w q) / sum(q^2)), each kept only when strictly better.
inline float reference_block_scale(const std::vector<float>& block, float amax, Int4Scale how) {
  if (amax == 0.0f) return 1.0f;
  auto half = [](float v) {
    uint16_t bits = f32_to_f16(v);
    if ((bits & 0x7fff) == 0) bits |= 1;
    if ((bits & 0x7fff) >= 0x7c00) bits = static_cast<uint16_t>((bits & 0x8000) | 0x7bff);
    return f16_to_f32(bits);
  };
  std::vector<float> cand;
  for (float c : {1.00f, 0.98f, 0.96f, 0.94f, 0.92f, 0.90f, 0.88f, 0.86f, 0.84f, 0.82f, 0.80f})
    cand.push_back(half((amax * c) / 7.0f));
  cand.push_back(half(amax / 8.0f));
  if (how == Int4Scale::Amax) return cand[0];
  for (size_t k = 1, count = cand.size(); k < count; ++k) cand.push_back(-cand[k]);
  struct Fit {
    double err = 0.0, wq = 0.0, qq = 0.0;
  };
  auto fit = [&](float s) {
    Fit f;
    for (float x : block) {
      const float q = std::clamp(std::nearbyint(x / s), -8.0f, 7.0f);
      const float e = x - q * s;
      f.err += static_cast<double>(e) * e;
      f.wq += static_cast<double>(x) * q;
      f.qq += static_cast<double>(q) * q;
    }
    return f;
  };
  float best_s = cand[0];
  Fit best = fit(cand[0]);
  for (size_t k = 1; k < cand.size(); ++k) {
    const Fit f = fit(cand[k]);
    if (f.err < best.err) {
      best = f;
      best_s = cand[k];
    }
  }
  for (int round = 0; round < 2 && best.qq > 0.0; ++round) {
    const float next = half(static_cast<float>(best.wq / best.qq));
    if (next == best_s) break;
    const Fit f = fit(next);
    if (!(f.err < best.err)) break;
    best = f;
    best_s = next;
  }
  return best_s;
}

inline std::vector<float> reference_dequantized(const Tensor& w, int64_t axis, int64_t block,
                                                Int4Scale how = Int4Scale::Mse) {
  const std::vector<float> v = w.to_f32();
  const int64_t rows = w.shape()[0], cols = w.shape()[1];
  const int64_t len = axis == 0 ? rows : cols;
  std::vector<float> out(v.size());
  for (int64_t other = 0; other < (axis == 0 ? cols : rows); ++other) {
    for (int64_t b = 0; b * block < len; ++b) {
      auto at = [&](int64_t i) {
        return static_cast<size_t>(axis == 0 ? i * cols + other : other * cols + i);
      };
      float amax = 0.0f;
      std::vector<float> values;
      for (int64_t i = b * block; i < std::min(len, (b + 1) * block); ++i) {
        amax = std::max(amax, std::fabs(v[at(i)]));
        values.push_back(v[at(i)]);
      }
      const float s = reference_block_scale(values, amax, how);
      for (int64_t i = b * block; i < std::min(len, (b + 1) * block); ++i) {
        const float q = std::clamp(std::nearbyint(v[at(i)] / s), -8.0f, 7.0f);
        out[at(i)] = f16_to_f32(f32_to_f16(q * s));
      }
    }
  }
  return out;
}

inline const Node* find_op(const Graph& g, const std::string& op, size_t nth = 0) {
  for (const Node& n : g.nodes)
    if (n.op_type == op && nth-- == 0) return &n;
  return nullptr;
}

inline const Node* producer_of(const Graph& g, const std::string& value) {
  for (const Node& n : g.nodes)
    for (const auto& o : n.outputs)
      if (o == value) return &n;
  return nullptr;
}

// Unfused (DequantizeLinear, then sgemm): bit-identical to the float model holding the
// dequantized weights, which these tests check. The fused int4 product adds in another order
// (runtime/int4_fusion.h; tests/unit/runtime/test_int4_fusion.cpp holds it to this path), and
// so does the packed product of a constant weight (kernels/packed_gemm.h: a Gemm's chain
// starts at beta * C), so neither side packs.
inline Tensor run_graph(const Graph& g, const Tensor& x) {
  Executor exec(g, {.device = Device::Cpu, .threads = 1, .fuse_int4 = false,
                    .pack_weights = false});
  return exec.run({{"x", x}}).at(0);
}

}  // namespace qforge::test::w4a16
