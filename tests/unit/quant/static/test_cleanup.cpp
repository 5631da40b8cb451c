// Identity / Dropout removal: consumers rewired, graph output names kept.
#include <gtest/gtest.h>

#include "quant/static/cleanup.h"
#include "tests/unit/quant/static/static_fixtures.h"

using namespace qforge;
using namespace qforge::test;

namespace {

PassReport run_cleanup(Graph& g) {
  PassReport r;
  r.pass = "cleanup";
  make_cleanup_pass()->run(g, r);
  return r;
}

Tensor bool_scalar(bool value) {
  Tensor t(DType::Bool, {});
  t.mutable_bytes()[0] = std::byte{value ? uint8_t{1} : uint8_t{0}};
  return t;
}

Graph base_graph() {
  Graph g;
  g.set_opset("", 13);
  g.inputs = {{.name = "x"}};
  return g;
}

}  // namespace

TEST(Cleanup, RemovesIdentityAndDropoutAndRewiresReaders) {
  Graph g = base_graph();
  g.nodes.push_back(make_node("relu", "Relu", {"x"}, {"a"}));
  g.nodes.push_back(make_node("id", "Identity", {"a"}, {"b"}));
  g.nodes.push_back(make_node("drop", "Dropout", {"b"}, {"c", "mask"}));
  g.nodes.push_back(make_node("sig", "Sigmoid", {"c"}, {"d"}));
  g.nodes.push_back(make_node("add", "Add", {"c", "b"}, {"y"}));
  g.outputs = {{.name = "y"}, {.name = "d"}};
  g.value_info = {{.name = "b"}, {.name = "a"}};
  const PassReport r = run_cleanup(g);
  ASSERT_EQ(g.nodes.size(), 3u);
  EXPECT_EQ(find_node(g, "sig")->inputs[0], "a");
  EXPECT_EQ(find_node(g, "add")->inputs, (std::vector<std::string>{"a", "a"}));
  EXPECT_EQ(r.stats["identity_removed"], 1);
  EXPECT_EQ(r.stats["dropout_removed"], 1);
  ASSERT_EQ(g.value_info.size(), 1u) << "declared types of removed values go";
  EXPECT_EQ(g.value_info[0].name, "a");
}

TEST(Cleanup, RemovedNodeProducingGraphOutputRenamesItsProducer) {
  Graph g = base_graph();
  g.nodes.push_back(make_node("relu", "Relu", {"x"}, {"a"}));
  g.nodes.push_back(make_node("id1", "Identity", {"a"}, {"b"}));
  g.nodes.push_back(make_node("id2", "Identity", {"b"}, {"out"}));
  g.nodes.push_back(make_node("sig", "Sigmoid", {"a"}, {"s"}));
  g.outputs = {{.name = "out"}, {.name = "s"}};
  const PassReport r = run_cleanup(g);
  ASSERT_EQ(g.nodes.size(), 2u);
  EXPECT_EQ(find_node(g, "relu")->outputs[0], "out") << "graph output name kept";
  EXPECT_EQ(find_node(g, "sig")->inputs[0], "out") << "other readers follow the rename";
  EXPECT_EQ(g.outputs[0].name, "out");
  EXPECT_EQ(r.stats["identity_removed"], 2);
}

TEST(Cleanup, KeepsNodesWhoseRemovalWouldChangeANameOrMeaning) {
  Graph g = base_graph();
  g.set_initializer("train", bool_scalar(true));
  g.nodes.push_back(make_node("id_in", "Identity", {"x"}, {"copy"}));  // graph input -> output
  g.nodes.push_back(make_node("relu", "Relu", {"x"}, {"a"}));
  g.nodes.push_back(make_node("masked", "Dropout", {"a"}, {"m", "mask"}));
  g.nodes.push_back(make_node("training", "Dropout", {"a", "", "train"}, {"t"}));
  g.nodes.push_back(make_node("id_a", "Identity", {"a"}, {"a_out"}));  // a is a graph output
  g.outputs = {{.name = "copy"}, {.name = "mask"},  {.name = "t"},
               {.name = "a"},    {.name = "a_out"}, {.name = "m"}};
  const PassReport r = run_cleanup(g);
  EXPECT_EQ(g.nodes.size(), 5u);
  EXPECT_EQ(r.stats["kept"], 4);
  EXPECT_TRUE(has_warning(r, "Dropout 'masked' kept: its mask output is used"));
  EXPECT_TRUE(has_warning(r, "Dropout 'training' kept: its training_mode input is true"));
  EXPECT_TRUE(has_warning(r, "Identity 'id_in' kept"));
  EXPECT_TRUE(has_warning(r, "Identity 'id_a' kept"));
}

TEST(Cleanup, DropoutWithFalseTrainingModeIsRemoved) {
  Graph g = base_graph();
  g.set_initializer("train", bool_scalar(false));
  g.set_initializer("ratio", Tensor::from_f32(std::vector<float>{0.1f}, {}));
  g.nodes.push_back(make_node("drop", "Dropout", {"x", "ratio", "train"}, {"d", "unused_mask"}));
  g.nodes.push_back(make_node("relu", "Relu", {"d"}, {"y"}));
  g.outputs = {{.name = "y"}};
  const PassReport r = run_cleanup(g);
  ASSERT_EQ(g.nodes.size(), 1u);
  EXPECT_EQ(g.nodes[0].inputs[0], "x");
  EXPECT_EQ(r.stats["dropout_removed"], 1);
  EXPECT_NO_THROW(g.check());
}

TEST(Cleanup, DropUnusedInitializersKeepsWhatIsStillRead) {
  Graph g = base_graph();
  g.set_initializer("used", random_weight({2}, 1));
  g.set_initializer("unused", random_weight({2}, 2));
  g.set_initializer("out", random_weight({2}, 3));
  g.nodes.push_back(make_node("add", "Add", {"x", "used"}, {"y"}));
  g.outputs = {{.name = "y"}, {.name = "out"}};
  const std::vector<std::string> candidates = {"used", "unused", "out", "missing"};
  EXPECT_EQ(drop_unused_initializers(g, candidates), 1);
  EXPECT_TRUE(g.has_initializer("used"));
  EXPECT_FALSE(g.has_initializer("unused"));
  EXPECT_TRUE(g.has_initializer("out"));
}
