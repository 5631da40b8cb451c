#pragma once
// Helpers for runtime tests: tensors from literals, one-node graphs, running them.
#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ir/error.h"
#include "ir/graph.h"
#include "runtime/executor.h"

namespace qforge::rt_test {

template <typename T>
Tensor make(DType dtype, Shape shape, const std::vector<T>& values) {
  Tensor t(dtype, std::move(shape));
  EXPECT_EQ(t.numel(), values.size()) << "literal size";
  if (!values.empty()) std::memcpy(t.mutable_bytes().data(), values.data(), t.nbytes());
  return t;
}
inline Tensor f32(Shape shape, const std::vector<float>& v) { return make(DType::F32, shape, v); }
inline Tensor i64(Shape shape, const std::vector<int64_t>& v) { return make(DType::I64, shape, v); }
inline Tensor i32(Shape shape, const std::vector<int32_t>& v) { return make(DType::I32, shape, v); }
inline Tensor boolean(Shape shape, const std::vector<uint8_t>& v) {
  return make(DType::Bool, shape, v);
}

inline Tensor random_f32(Shape shape, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  Tensor t(DType::F32, std::move(shape));
  for (float& v : t.mutable_data<float>()) v = dist(rng);
  return t;
}

template <typename T>
std::vector<T> values(const Tensor& t) {
  const auto d = t.data<T>();
  return {d.begin(), d.end()};
}

inline Attribute attr_int(std::string name, int64_t v) {
  return Attribute::make_int(std::move(name), v);
}
inline Attribute attr_float(std::string name, float v) {
  return Attribute::make_float(std::move(name), v);
}
inline Attribute attr_ints(std::string name, std::vector<int64_t> v) {
  return Attribute::make_ints(std::move(name), std::move(v));
}
inline Attribute attr_string(std::string name, std::string v) {
  return Attribute::make_string(std::move(name), std::move(v));
}

// A one-node graph: inputs named in0, in1, ... (an empty Tensor leaves that input absent),
// outputs out0, out1, ...
struct OneNode {
  std::string op;
  std::vector<Tensor> inputs;
  std::vector<Attribute> attrs = {};
  size_t outputs = 1;
  int64_t opset = 21;
  std::string domain = "";
};

inline Graph one_node_graph(const OneNode& spec) {
  Graph g;
  g.set_opset(spec.domain, spec.opset);
  if (!spec.domain.empty()) g.set_opset("", 21);
  Node n;
  n.name = "n";
  n.op_type = spec.op;
  n.domain = spec.domain;
  n.attributes = spec.attrs;
  for (size_t i = 0; i < spec.inputs.size(); ++i) {
    if (spec.inputs[i].empty()) {
      n.inputs.push_back("");
      continue;
    }
    const std::string name = "in" + std::to_string(i);
    g.inputs.push_back({.name = name, .dtype = spec.inputs[i].dtype()});
    n.inputs.push_back(name);
  }
  for (size_t i = 0; i < spec.outputs; ++i) {
    n.outputs.push_back("out" + std::to_string(i));
    g.outputs.push_back({.name = "out" + std::to_string(i)});
  }
  g.nodes.push_back(std::move(n));
  return g;
}

inline std::vector<Tensor> run_node(const OneNode& spec, int threads = 1) {
  Executor ex(one_node_graph(spec), {.device = Device::Cpu, .threads = threads});
  std::vector<std::pair<std::string, Tensor>> feeds;
  for (size_t i = 0; i < spec.inputs.size(); ++i) {
    if (!spec.inputs[i].empty()) feeds.emplace_back("in" + std::to_string(i), spec.inputs[i]);
  }
  return ex.run(feeds);
}
inline Tensor run1(const OneNode& spec) { return run_node(spec).at(0); }

// The error a call throws (category and message); fails the test if it does not throw.
struct Caught {
  ErrorCategory category = ErrorCategory::Internal;
  std::string message;
};
template <typename F>
Caught catch_error(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return {e.category(), e.what()};
  }
  ADD_FAILURE() << "expected an Error";
  return {ErrorCategory::Internal, "<no error>"};
}

// Bit for bit, element by element; `what` names the case in a failure.
inline void expect_same_bits(const std::vector<float>& got, const std::vector<float>& want,
                             const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(want[i]))
        << what << ", element " << i << ": " << got[i] << " against " << want[i];
  }
}

inline void expect_near_all(const std::vector<float>& got, const std::vector<float>& want,
                            float tol = 1e-5f) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], tol) << "at " << i;
}

}  // namespace qforge::rt_test
