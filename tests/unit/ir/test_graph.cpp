#include <gtest/gtest.h>

#include <algorithm>
#include <span>
#include <vector>

#include "ir/error.h"
#include "ir/graph.h"
#include "ir/pass.h"

using namespace qforge;

namespace {

Node make_node(std::string name, std::string op, std::vector<std::string> in,
               std::vector<std::string> out) {
  Node n;
  n.name = std::move(name);
  n.op_type = std::move(op);
  n.inputs = std::move(in);
  n.outputs = std::move(out);
  return n;
}

Graph chain() {
  Graph g;
  g.inputs.push_back({.name = "x", .dtype = DType::F32});
  g.set_initializer("w", Tensor(DType::F32, {4, 4}));
  g.nodes.push_back(make_node("mm", "MatMul", {"x", "w"}, {"h"}));
  g.nodes.push_back(make_node("relu", "Relu", {"h"}, {"y"}));
  g.outputs.push_back({.name = "y"});
  return g;
}

std::string check_message(const Graph& g) {
  try {
    g.check();
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), ErrorCategory::InvalidInput);
    return e.what();
  }
  return "";
}

}  // namespace

TEST(Graph, CheckAcceptsWellFormedChain) { EXPECT_EQ(check_message(chain()), ""); }

TEST(Graph, CheckNamesDanglingInput) {
  Graph g = chain();
  g.nodes[1].inputs[0] = "missing";
  const auto msg = check_message(g);
  EXPECT_NE(msg.find("Relu 'relu'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'missing'"), std::string::npos) << msg;
}

TEST(Graph, CheckNamesDoublyProducedValue) {
  Graph g = chain();
  g.nodes[1].outputs[0] = "h";
  g.outputs[0].name = "h";
  const auto msg = check_message(g);
  EXPECT_NE(msg.find("produced twice"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'relu'"), std::string::npos) << msg;
}

TEST(Graph, CheckFindsCycle) {
  Graph g = chain();
  g.nodes[0].inputs[0] = "y";  // mm reads relu's output, relu reads mm's
  const auto msg = check_message(g);
  EXPECT_NE(msg.find("cycle"), std::string::npos) << msg;
}

TEST(Graph, CheckFindsOutOfOrderNodes) {
  Graph g = chain();
  std::swap(g.nodes[0], g.nodes[1]);
  const auto msg = check_message(g);
  EXPECT_NE(msg.find("topological order"), std::string::npos) << msg;
  g.topological_sort();
  EXPECT_EQ(g.nodes[0].name, "mm");
  EXPECT_EQ(check_message(g), "");
}

TEST(Graph, CheckFindsInitializerShapeMismatch) {
  Graph g = chain();
  g.value_info.push_back({.name = "w", .dtype = DType::F32,
                          .shape = std::vector<Dim>{{.value = 4}, {.value = 5}}});
  const auto msg = check_message(g);
  EXPECT_NE(msg.find("'w'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[4, 4]"), std::string::npos) << msg;
}

TEST(Graph, CheckSeesOuterScopeFromSubgraph) {
  Graph g = chain();
  auto body = std::make_shared<Graph>();
  body->nodes.push_back(make_node("inner", "Identity", {"h"}, {"z"}));
  body->outputs.push_back({.name = "z"});
  Node if_node = make_node("branch", "If", {"cond"}, {"out"});
  Attribute a;
  a.name = "then_branch";
  a.type = AttrType::Graph;
  a.g = body;
  if_node.attributes.push_back(a);
  g.inputs.push_back({.name = "cond", .dtype = DType::Bool});
  g.nodes.push_back(if_node);
  EXPECT_EQ(check_message(g), "");
  body->nodes[0].inputs[0] = "nowhere";
  EXPECT_NE(check_message(g).find("'nowhere'"), std::string::npos);
}

TEST(Graph, InitializersKeepOrderAndReplace) {
  Graph g;
  g.set_initializer("b", Tensor(DType::F32, {1}));
  g.set_initializer("a", Tensor(DType::F32, {2}));
  g.set_initializer("b", Tensor(DType::I8, {3}));
  ASSERT_EQ(g.initializers().size(), 2u);
  EXPECT_EQ(g.initializers()[0].first, "b");
  EXPECT_EQ(g.find_initializer("b")->dtype(), DType::I8);
  g.remove_initializer("b");
  EXPECT_EQ(g.find_initializer("b"), nullptr);
  EXPECT_NE(g.find_initializer("a"), nullptr);
  EXPECT_EQ(g.parameter_count(), 2u);
}

TEST(Tensor, WindowMustFitStorage) {
  auto storage = std::make_shared<OwnedStorage>(16);
  EXPECT_NO_THROW(Tensor(DType::F32, {2}, storage, 8));
  EXPECT_THROW(Tensor(DType::F32, {3}, storage, 8), Error);
  EXPECT_THROW(Tensor(DType::F32, {-1}), Error);
}

TEST(Tensor, CopyOfHoldsItsOwnCopyOfExactlyItsBytes) {
  std::vector<std::byte> src(12);
  for (size_t i = 0; i < src.size(); ++i) src[i] = std::byte(i * 7 + 1);
  Tensor t = Tensor::copy_of(DType::I16, {2, 3}, src);
  ASSERT_EQ(t.nbytes(), 12u);
  EXPECT_TRUE(std::equal(src.begin(), src.end(), t.bytes().begin()));
  EXPECT_NE(t.bytes().data(), src.data());
  src[0] = std::byte{0};  // the copy does not follow its source
  EXPECT_EQ(t.bytes()[0], std::byte{1});
  t.mutable_bytes()[1] = std::byte{0x55};  // and it is writable, as a new tensor is
  EXPECT_EQ(t.bytes()[1], std::byte{0x55});
  // Padding past the bytes is zero; no bytes at all make an empty tensor.
  const Tensor odd = Tensor::copy_of(DType::I4, {3}, std::span(src).first(2));
  EXPECT_EQ(odd.to_f32().size(), 3u);
  EXPECT_EQ(Tensor::copy_of(DType::F32, {0, 4}, {}).numel(), 0u);
  EXPECT_THROW(Tensor::copy_of(DType::F32, {2}, std::span(src).first(4)), Error);
  EXPECT_THROW(Tensor::copy_of(DType::F32, {2}, std::span(src)), Error);
}

TEST(Tensor, ToF32UnpacksInt4LowNibbleFirst) {
  Tensor t(DType::I4, {3});
  t.mutable_bytes()[0] = std::byte{0x8F};  // low nibble 0xF = -1, high 0x8 = -8
  t.mutable_bytes()[1] = std::byte{0x07};
  const auto v = t.to_f32();
  EXPECT_EQ(v, (std::vector<float>{-1.0f, -8.0f, 7.0f}));
}

namespace {
struct CountingPass : Pass {
  std::string_view name() const override { return "counting"; }
  void run(Graph& graph, PassReport& report) override {
    report.count("nodes", static_cast<int64_t>(graph.nodes.size()));
    report.warn("just looking");
  }
};
}  // namespace

TEST(Pipeline, CollectsReportsInOrder) {
  Graph g = chain();
  Pipeline p;
  p.add(std::make_unique<CountingPass>()).add(std::make_unique<CountingPass>());
  const auto report = p.run(g);
  ASSERT_EQ(report.passes.size(), 2u);
  EXPECT_EQ(report.passes[0].stats["nodes"], 2);
  EXPECT_EQ(report.to_json()[1]["warnings"][0], "just looking");
}

TEST(Graph, UniqueNamesGivesWhatUniqueNameWouldAndTakesEach) {
  Graph g = chain();
  g.nodes.push_back(make_node("h_scale", "Relu", {"y"}, {"h_scale_1"}));
  UniqueNames names(g);
  // Values, node names and initializers are all in use.
  for (const std::string hint : {"x", "w", "mm", "y_new", "h_scale"}) {
    EXPECT_EQ(names.take(hint), g.unique_name(hint)) << hint;
  }
  // Each name given out is taken: the same hint gives the next free one.
  EXPECT_EQ(names.take("y_new"), "y_new_1");
  EXPECT_EQ(names.take("h_scale"), "h_scale_3");  // h_scale_1 is a value, h_scale_2 was given
  EXPECT_EQ(names.take("w"), "w_2");
}
