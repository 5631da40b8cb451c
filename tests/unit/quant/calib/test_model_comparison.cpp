// compare_models(): a hand-made float/"quantized" pair whose per-layer errors are known, with
// all-zero, identical, masked (-inf and NaN on both sides) and mismatched non-finite values;
// the layers come worst first whatever their names, and a model against itself is exact.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "ir/batch_source.h"
#include "ir/error.h"
#include "quant/calib/model_comparison.h"
#include "tests/unit/runtime/runtime_test_util.h"

using namespace qforge;
using namespace qforge::rt_test;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

struct Factors {
  float a = 1.0f;  // a = x * a
  float b = 1.0f;  // b = x * b
  float z = 0.0f;  // z = x * z: all zero in the float model
  float d = 1.0f;  // d = x / d: x / 0 is +-inf or NaN
};

// x [N, 4] -> a, b, z, d as above, same = Relu(x), zz = x * 0, m = Log(x) (-inf at 0, NaN
// below: a mask both models compute alike) -> out = Concat(all, axis 1).
Graph pair_member(const Factors& f) {
  Graph g;
  g.inputs.push_back({"x", DType::F32, std::vector<Dim>{Dim{std::nullopt, "N"}, Dim{4, ""}}, ""});
  g.outputs.push_back({"out", DType::F32, std::nullopt, ""});
  g.set_initializer("ka", f32({}, {f.a}));
  g.set_initializer("kb", f32({}, {f.b}));
  g.set_initializer("kz", f32({}, {f.z}));
  g.set_initializer("kd", f32({}, {f.d}));
  g.set_initializer("zero", f32({}, {0.0f}));
  g.nodes.push_back(Node{"n_a", "Mul", "", {"x", "ka"}, {"a"}, {}, ""});
  g.nodes.push_back(Node{"n_b", "Mul", "", {"x", "kb"}, {"b"}, {}, ""});
  g.nodes.push_back(Node{"n_z", "Mul", "", {"x", "kz"}, {"z"}, {}, ""});
  g.nodes.push_back(Node{"n_d", "Div", "", {"x", "kd"}, {"d"}, {}, ""});
  g.nodes.push_back(Node{"n_same", "Relu", "", {"x"}, {"same"}, {}, ""});
  g.nodes.push_back(Node{"n_zz", "Mul", "", {"x", "zero"}, {"zz"}, {}, ""});
  g.nodes.push_back(Node{"n_m", "Log", "", {"x"}, {"m"}, {}, ""});
  g.nodes.push_back(Node{"n_out", "Concat", "", {"a", "b", "z", "same", "zz", "m", "d"}, {"out"},
                         {attr_int("axis", 1)}, ""});
  g.set_opset("", 17);
  return g;
}

// Two batches, with zeros and negative values (so Log gives -inf and NaN, and x / 0 all three).
MemoryBatches samples() {
  return MemoryBatches({{{"x", f32({2, 4}, {0.5f, -1.0f, 0.0f, 2.0f, 1.5f, 3.0f, -0.25f, 1.0f})}},
                        {{"x", f32({1, 4}, {4.0f, 0.0f, -2.0f, 0.75f})}}});
}

std::vector<std::string> names(const std::vector<ValueComparison>& v) {
  std::vector<std::string> out;
  for (const ValueComparison& c : v) out.push_back(c.name);
  return out;
}

}  // namespace

TEST(CompareModels, LayersComeWorstFirstWithKnownFigures) {
  const Graph ref = pair_member({});
  const Graph quant = pair_member({.a = 1.01f, .b = 1.5f, .z = 0.1f, .d = 0.0f});
  MemoryBatches data = samples();
  const ModelComparison r = compare_models(ref, quant, data, {});
  EXPECT_EQ(r.samples, 3);
  // -inf (a non-finite mismatch; an all-zero float value), ties by cosine (both 0) then name;
  // then 6 dB, 40 dB; identical values last (the mask m included), by name.
  EXPECT_EQ(names(r.layers),
            (std::vector<std::string>{"d", "z", "b", "a", "m", "same", "zz"}));
  const auto& L = r.layers;
  EXPECT_EQ(L[0].error.sqnr_db(), -kInf);
  EXPECT_GT(L[0].error.nonfinite_mismatches, 0);
  EXPECT_EQ(L[1].error.sqnr_db(), -kInf);
  EXPECT_EQ(L[1].error.cosine(), 0.0);
  EXPECT_NEAR(L[2].error.sqnr_db(), 10.0 * std::log10(1.0 / 0.25), 1e-5);
  EXPECT_NEAR(L[3].error.sqnr_db(), 10.0 * std::log10(1.0 / (0.01 * 0.01)), 0.01);
  for (size_t i = 4; i < L.size(); ++i) {
    EXPECT_TRUE(L[i].error.exact()) << L[i].name;
    EXPECT_EQ(L[i].error.sqnr_db(), kInf) << L[i].name;
    EXPECT_EQ(L[i].error.cosine(), 1.0) << L[i].name;
  }
  for (const ValueComparison& c : L) {
    EXPECT_FALSE(std::isnan(c.error.sqnr_db())) << c.name;
    EXPECT_FALSE(std::isnan(c.error.cosine())) << c.name;
    EXPECT_FALSE(std::isnan(c.error.max_abs)) << c.name;
  }
  ASSERT_EQ(r.outputs.size(), 1u);
  EXPECT_EQ(r.outputs[0].name, "out");
  EXPECT_EQ(r.outputs[0].error.sqnr_db(), -kInf) << "the output carries d's mismatch";
}

TEST(CompareModels, AModelAgainstItselfIsExactEverywhere) {
  const Graph g = pair_member({.d = 0.0f});  // d holds +-inf and NaN on both sides
  MemoryBatches data = samples();
  const ModelComparison r = compare_models(g, g, data, {});
  ASSERT_EQ(r.layers.size(), 7u);
  for (const ValueComparison& c : r.layers) {
    EXPECT_EQ(c.error.sqnr_db(), kInf) << c.name;
    EXPECT_EQ(c.error.cosine(), 1.0) << c.name;
    EXPECT_EQ(c.error.max_abs, 0.0) << c.name;
  }
  EXPECT_EQ(r.outputs[0].error.sqnr_db(), kInf);
}

TEST(CompareModels, MissingOutputIsInvalidInput) {
  const Graph ref = pair_member({});
  Graph quant = pair_member({});
  quant.outputs[0].name = "a";
  MemoryBatches data = samples();
  try {
    compare_models(ref, quant, data, {.float_name = "f.onnx", .quant_name = "q.onnx"});
    FAIL() << "accepted a quantized model without the output 'out'";
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), ErrorCategory::InvalidInput);
    EXPECT_EQ(std::string(e.what()), "compare: output 'out' of f.onnx is not an output of q.onnx");
  }
}
