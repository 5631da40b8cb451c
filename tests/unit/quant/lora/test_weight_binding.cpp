// WeightBinder and bind_weights: names, suffixes, node scopes, content; merging into ONNX-style
// transposed MatMul weights.
#include <gtest/gtest.h>

#include "ir/half.h"
#include "quant/lora/lora_merge.h"
#include "quant/lora/weight_binding.h"
#include "tests/unit/quant/lora/lora_test_util.h"

using namespace qforge;
using namespace qforge::lora_test;

namespace {

Node matmul(const std::string& name, const std::string& weight, const std::string& op = "MatMul") {
  Node n;
  n.name = name;
  n.op_type = op;
  n.inputs = {"x", weight};
  n.outputs = {name + "_out"};
  return n;
}

// An old-exporter graph: query's weight is an anonymous transposed copy, its bias keeps its name.
Graph exported_graph(const Tensor& query_weight) {
  Graph g;
  const auto v = query_weight.to_f32();
  const int64_t out = query_weight.shape()[0], in = query_weight.shape()[1];
  g.set_initializer("onnx::MatMul_12", Tensor::from_f32(ref_transpose(v, out, in), {in, out}));
  g.set_initializer("encoder.layer.0.attention.self.query.bias", random_tensor({out}, 99));
  g.nodes.push_back(matmul("/encoder/layer.0/attention/self/query/MatMul", "onnx::MatMul_12"));
  return g;
}

}  // namespace

TEST(WeightBinding, ExactThenSuffixOnEitherSide) {
  Graph g;
  g.set_initializer("bert.encoder.layer.0.output.dense.weight", random_tensor({2, 2}, 1));
  g.set_initializer("pooler.dense.weight", random_tensor({2, 2}, 2));
  const WeightBinder binder(g, {});
  auto r = binder.bind("bert.encoder.layer.0.output.dense.weight");
  ASSERT_TRUE(r.binding);
  EXPECT_EQ(r.binding->kind, BindKind::Exact);
  r = binder.bind("encoder.layer.0.output.dense.weight");  // target has an extra prefix
  ASSERT_TRUE(r.binding);
  EXPECT_EQ(r.binding->kind, BindKind::Suffix);
  r = binder.bind("model.bert.pooler.dense.weight");  // source has an extra prefix
  ASSERT_TRUE(r.binding);
  EXPECT_EQ(r.binding->initializer, "pooler.dense.weight");
}

TEST(WeightBinding, NeverDropsALayerIndexAndRefusesAmbiguity) {
  Graph g;
  g.set_initializer("layers.0.q.weight", random_tensor({2, 2}, 1));
  g.set_initializer("model.a.q.weight", random_tensor({2, 2}, 2));
  g.set_initializer("model.b.q.weight", random_tensor({2, 2}, 3));
  const WeightBinder binder(g, {});
  EXPECT_FALSE(binder.bind("layers.5.q.weight").binding);  // would need dropping "layers.5"
  const auto r = binder.bind("q.weight");
  EXPECT_FALSE(r.binding);
  EXPECT_NE(r.why_not.find("several initializers"), std::string::npos) << r.why_not;
  EXPECT_FALSE(binder.bind("model.a.q.weight", std::vector<int64_t>{3, 2}).binding);  // wrong shape
}

TEST(WeightBinding, NodeScopeFindsTransposedMatMulWeight) {
  const Tensor q = random_tensor({4, 6}, 5);
  const Graph g = exported_graph(q);
  const WeightBinder binder(g, {});
  const auto r =
      binder.bind("bert.encoder.layer.0.attention.self.query.weight", std::vector<int64_t>{4, 6});
  ASSERT_TRUE(r.binding) << r.why_not;
  EXPECT_EQ(r.binding->initializer, "onnx::MatMul_12");
  EXPECT_TRUE(r.binding->transposed);
  EXPECT_EQ(r.binding->kind, BindKind::NodeScope);
}

TEST(WeightBinding, GemmTransBDecidesOrientation) {
  Graph g;
  g.set_initializer("onnx::Gemm_3", random_tensor({4, 6}, 1));
  Node n = matmul("/fc/Gemm", "onnx::Gemm_3", "Gemm");
  n.set_attr(Attribute::make_int("transB", 1));
  g.nodes.push_back(n);
  const auto r = WeightBinder(g, {}).bind("fc.weight", std::vector<int64_t>{4, 6});
  ASSERT_TRUE(r.binding);
  EXPECT_FALSE(r.binding->transposed);
}

TEST(WeightBinding, ContentMatchesPlainAndTransposedCopies) {
  Graph reference;
  reference.set_initializer("a.weight", random_tensor({5, 8}, 1));
  reference.set_initializer("b.weight", random_tensor({5, 8}, 2));
  reference.set_initializer("z.weight", Tensor(DType::F32, {5, 8}));
  Graph g;
  g.set_initializer("onnx::MatMul_1",
                    Tensor::from_f32(ref_transpose(random_values(40, 1), 5, 8), {8, 5}));
  g.set_initializer("const_7", random_tensor({5, 8}, 2));
  g.set_initializer("zeros_1", Tensor(DType::F32, {5, 8}));
  g.set_initializer("zeros_2", Tensor(DType::F32, {5, 8}));
  const WeightBinder binder(g, BindOptions{&reference});
  auto r = binder.bind("a.weight");
  ASSERT_TRUE(r.binding) << r.why_not;
  EXPECT_EQ(r.binding->kind, BindKind::TransposedContent);
  EXPECT_TRUE(r.binding->transposed);
  r = binder.bind("b.weight");
  ASSERT_TRUE(r.binding) << r.why_not;
  EXPECT_EQ(r.binding->kind, BindKind::Content);
  r = binder.bind("z.weight");
  EXPECT_FALSE(r.binding);
  EXPECT_NE(r.why_not.find("several initializers hold its values"), std::string::npos) << r.why_not;
}

TEST(WeightBinding, BindWeightsTransposesAndKeepsInitializerDtype) {
  const Tensor q = random_tensor({4, 6}, 5);
  Graph g = exported_graph(q);
  g.set_initializer(
      "onnx::MatMul_12",
      Tensor::from_f32(g.find_initializer("onnx::MatMul_12")->to_f32(), {6, 4}, DType::F16));
  Graph checkpoint;
  checkpoint.set_initializer("encoder.layer.0.attention.self.query.weight",
                             random_tensor({4, 6}, 6));
  checkpoint.set_initializer("encoder.layer.0.attention.self.query.bias", random_tensor({4}, 7));
  PassReport report;
  bind_weights(g, checkpoint, {}, report);
  const Tensor& w = *g.find_initializer("onnx::MatMul_12");
  ASSERT_EQ(w.dtype(), DType::F16);
  const auto want = ref_transpose(random_values(24, 6), 4, 6);
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_EQ(w.data<uint16_t>()[i], f32_to_f16(want[i])) << i;
  EXPECT_TRUE(g.find_initializer("encoder.layer.0.attention.self.query.bias")
                  ->equals(random_tensor({4}, 7)));
  EXPECT_EQ(report.stats["bindings"][0]["match"], "node-scope");
  EXPECT_EQ(report.stats["bindings"][1]["match"], "name");
}

TEST(WeightBinding, BindWeightsListsUnmatchedTensors) {
  Graph g = exported_graph(random_tensor({4, 6}, 5));
  Graph checkpoint;
  checkpoint.set_initializer("encoder.layer.0.attention.self.query.bias", random_tensor({4}, 7));
  checkpoint.set_initializer("encoder.layer.0.attention.self.key.weight", random_tensor({4, 6}, 8));
  const Tensor before = *g.find_initializer("encoder.layer.0.attention.self.query.bias");
  expect_error(
      [&] {
        PassReport r;
        bind_weights(g, checkpoint, {}, r);
      },
      ErrorCategory::InvalidInput,
      {"1 of 2 checkpoint tensors", "encoder.layer.0.attention.self.key.weight"});
  EXPECT_TRUE(g.find_initializer("encoder.layer.0.attention.self.query.bias")->equals(before));
  PassReport r;
  bind_weights(g, checkpoint, BindOptions{nullptr, true}, r);
  EXPECT_EQ(r.stats["unmatched"], 1);
  EXPECT_EQ(r.warnings.size(), 1u);
}

TEST(WeightBinding, LoraMergeWritesTransposedDeltaIntoMatMulCopy) {
  const Tensor q = random_tensor({4, 6}, 5);
  Graph g = exported_graph(q);
  Graph reference;  // a second graph: the same copy found by content instead of node scope
  reference.set_initializer("encoder.layer.0.attention.self.query.weight", q);
  Graph w;
  w.set_initializer("base_model.model.encoder.layer.0.attention.self.query.lora_A.weight",
                    random_tensor({2, 6}, 1));
  w.set_initializer("base_model.model.encoder.layer.0.attention.self.query.lora_B.weight",
                    random_tensor({4, 2}, 2));
  const LoraAdapter a = peft_adapter(config_json(2, 4), w);
  const auto d = ref_delta(random_values(12, 1), random_values(8, 2), 4, 6, 2, 2.0f);
  std::vector<float> want = q.to_f32();
  for (size_t i = 0; i < want.size(); ++i) want[i] += d[i];
  want = ref_transpose(want, 4, 6);
  for (bool by_content : {false, true}) {
    Graph target = g;
    if (by_content) target.nodes.clear();
    LoraMergeOptions opts;
    opts.reference = by_content ? &reference : nullptr;
    PassReport report;
    merge_lora(target, {{a, 1.0}}, opts, report);
    EXPECT_EQ(report.stats["modules"][0]["match"],
              by_content ? "transposed-content" : "node-scope");
    expect_near_all(target.find_initializer("onnx::MatMul_12")->to_f32(), want, 1e-6f,
                    "onnx merge");
  }
}

TEST(WeightBinding, MergeWarnsWhenAnInitializerFeedsSeveralModules) {
  Graph g = exported_graph(random_tensor({4, 6}, 5));
  Node add = matmul("/encoder/layer.0/attention/self/query/Add",
                    "encoder.layer.0.attention.self.query.bias", "Add");
  Node other = matmul("/encoder/layer.1/attention/self/query/Add",
                      "encoder.layer.0.attention.self.query.bias", "Add");
  g.nodes.push_back(add);
  g.nodes.push_back(other);  // a deduplicated bias: layer 1 reads layer 0's
  Graph w;
  const std::string m = "base_model.model.encoder.layer.0.attention.self.query";
  w.set_initializer(m + ".lora_A.weight", random_tensor({2, 6}, 1));
  w.set_initializer(m + ".lora_B.weight", random_tensor({4, 2}, 2));
  w.set_initializer(m + ".lora_B.bias", random_tensor({4}, 3));
  PassReport report;
  merge_lora(g, {{peft_adapter(config_json(2, 4, "\"lora_bias\": true"), w), 1.0}}, {}, report);
  ASSERT_EQ(report.warnings.size(), 1u);
  EXPECT_NE(report.warnings[0].find(
                "'encoder.layer.0.attention.self.query.bias' feeds 2 nodes in 2 modules"),
            std::string::npos)
      << report.warnings[0];
}
