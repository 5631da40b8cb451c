// One scale for every input and the output of a Concat (on by default), and for a residual
// Add's two inputs (an option): the union of their ranges (quant/static/shared_scales.h).
#include <gtest/gtest.h>

#include "ir/calibration_table.h"
#include "quant/static/shared_scales.h"
#include "tests/unit/quant/static/static_fixtures.h"

using namespace qforge;
using namespace qforge::test;

namespace {

// a, b -> Concat -> c -> MatMul(w) -> y; b is also read by a MatMul of its own (-> z).
Graph concat_graph() {
  Graph g;
  g.set_opset("", 17);
  g.inputs = {{.name = "a", .dtype = DType::F32}, {.name = "b", .dtype = DType::F32}};
  g.set_initializer("w", random_weight({8, 3}, 7));
  g.set_initializer("v", random_weight({4, 2}, 8));
  g.nodes.push_back(make_node("cat", "Concat", {"a", "b"}, {"c"},
                              {Attribute::make_int("axis", 1)}));
  g.nodes.push_back(make_node("mm", "MatMul", {"c", "w"}, {"y"}));
  g.nodes.push_back(make_node("side", "MatMul", {"b", "v"}, {"z"}));
  g.outputs = {{.name = "y"}, {.name = "z"}};
  return g;
}

const std::map<std::string, float> kRanges = {{"a", 1.5f}, {"b", 6.0f}, {"c", 5.5f}};

}  // namespace

TEST(StaticInt8SharedScale, ConcatInputsAndOutputShareTheWidestRange) {
  Graph g = concat_graph();
  const PassReport r = run_static(g, kRanges);
  // Every Q/DQ of the group carries 6 / 127: a's, b's (its other reader too) and c's.
  expect_activation_qdq(g, "cat", 0, "a", 6.0f);
  expect_activation_qdq(g, "cat", 1, "b", 6.0f);
  expect_activation_qdq(g, "side", 0, "b", 6.0f);
  expect_activation_qdq(g, "mm", 0, "c", 6.0f);
  EXPECT_EQ(count_ops(g, "QuantizeLinear"), 3u) << "one pair per tensor";
  ASSERT_EQ(r.stats["shared_scale_groups"].size(), 1u);
  EXPECT_EQ(r.stats["shared_scale_groups"][0]["members"],
            (nlohmann::ordered_json{"a", "b", "c"}));
  EXPECT_EQ(r.stats["shared_scale_groups"][0]["amax"], 6.0f);
  EXPECT_EQ(r.stats["nodes_quantized"], 3);
}

TEST(StaticInt8SharedScale, OffLeavesConcatFloatAndRangesApart) {
  Graph g = concat_graph();
  StaticInt8Options o;
  o.activation_amax = kRanges;
  o.concat_shared_scale = false;
  const PassReport r = run_static(g, o);
  EXPECT_EQ(find_node(g, "cat")->inputs, (std::vector<std::string>{"a", "b"}));
  expect_activation_qdq(g, "side", 0, "b", 6.0f);
  expect_activation_qdq(g, "mm", 0, "c", 5.5f);
  EXPECT_TRUE(r.stats["shared_scale_groups"].empty());
  EXPECT_EQ(r.stats["nodes_quantized"], 2);
}

TEST(StaticInt8SharedScale, ConcatWithoutRangesOrWithAConstantStaysFloatQuietly) {
  Graph g = concat_graph();
  g.set_initializer("k", random_weight({1, 2}, 9));
  g.nodes.insert(g.nodes.begin(), make_node("shape_cat", "Concat", {"s0", "s1"}, {"s"}));
  g.nodes.insert(g.nodes.begin() + 1, make_node("const_cat", "Concat", {"a", "k"}, {"ak"}));
  g.inputs.push_back({.name = "s0", .dtype = DType::I64});
  g.inputs.push_back({.name = "s1", .dtype = DType::I64});
  g.outputs.push_back({.name = "s"});
  g.outputs.push_back({.name = "ak"});
  const PassReport r = run_static(g, kRanges);
  EXPECT_EQ(find_node(g, "shape_cat")->inputs, (std::vector<std::string>{"s0", "s1"}));
  EXPECT_EQ(find_node(g, "const_cat")->inputs, (std::vector<std::string>{"a", "k"}));
  EXPECT_EQ(r.stats["concat_left_float"], 2);
  EXPECT_FALSE(has_warning(r, "no calibrated range")) << "shape arithmetic is not an activation";
  expect_activation_qdq(g, "cat", 0, "a", 6.0f);
}

TEST(StaticInt8SharedScale, ExcludedConcatJoinsNothing) {
  Graph g = concat_graph();
  StaticInt8Options o;
  o.activation_amax = kRanges;
  o.exclude = std::regex("^cat$");
  run_static(g, o);
  expect_activation_qdq(g, "side", 0, "b", 6.0f);
  expect_activation_qdq(g, "mm", 0, "c", 5.5f);
}

TEST(StaticInt8SharedScale, ResidualAddByOption) {
  for (const bool shared : {false, true}) {
    SCOPED_TRACE(shared);
    Graph g;
    g.set_opset("", 13);
    g.inputs = {{.name = "a"}, {.name = "b"}};
    g.nodes.push_back(make_node("residual", "Add", {"a", "b"}, {"y"}));
    g.outputs.push_back({.name = "y"});
    StaticInt8Options o;
    o.activation_amax = {{"a", 1.0f}, {"b", 4.0f}, {"y", 4.5f}};
    o.add_shared_scale = shared;
    run_static(g, o);
    expect_activation_qdq(g, "residual", 0, "a", shared ? 4.0f : 1.0f);
    expect_activation_qdq(g, "residual", 1, "b", 4.0f);
  }
}

TEST(StaticInt8SharedScale, GroupsLinkedByAMemberMerge) {
  // a|b -> c and b|d -> e: one group {a, b, c, d, e} with the largest range of all.
  Graph g;
  g.set_opset("", 17);
  for (const char* n : {"a", "b", "d"}) g.inputs.push_back({.name = n, .dtype = DType::F32});
  const Attribute axis = Attribute::make_int("axis", 1);
  g.nodes.push_back(make_node("cat1", "Concat", {"a", "b"}, {"c"}, {axis}));
  g.nodes.push_back(make_node("cat2", "Concat", {"b", "d"}, {"e"}, {axis}));
  g.outputs = {{.name = "c"}, {.name = "e"}};
  StaticInt8Options o;
  o.activation_amax = {{"a", 1.0f}, {"b", 2.0f}, {"c", 2.0f}, {"d", 9.0f}, {"e", 9.0f}};
  const std::vector<SharedScaleGroup> groups = shared_scale_groups(g, o);
  ASSERT_EQ(groups.size(), 1u);
  EXPECT_EQ(groups[0].members, (std::vector<std::string>{"a", "b", "c", "d", "e"}));
  EXPECT_EQ(groups[0].amax, 9.0f);
  // The bundle's calibration table follows the graph.
  CalibrationTable table;
  for (const auto& [n, amax] : o.activation_amax) table.ranges[n].amax = amax;
  EXPECT_EQ(share_table_ranges(g, o, table), 3);
  for (const auto& [n, range] : table.ranges) EXPECT_EQ(range.amax, 9.0f) << n;
}
