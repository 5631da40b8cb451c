// upgrade_default_opset: each schema change rewritten to the opset 21 form, checked both
// structurally and by running the graph before and after on the CPU executor.
#include <gtest/gtest.h>

#include <cstring>
#include <limits>

#include "quant/opset.h"
#include "runtime/executor.h"
#include "tests/unit/runtime/runtime_test_util.h"

namespace qforge {
namespace {

using rt_test::attr_float;
using rt_test::attr_int;
using rt_test::attr_ints;
using rt_test::attr_string;
using rt_test::f32;
using rt_test::OneNode;
using rt_test::random_f32;

std::vector<Tensor> run(const Graph& g, const std::vector<std::pair<std::string, Tensor>>& feeds) {
  Executor ex(g, {.device = Device::Cpu, .threads = 1});
  return ex.run(feeds);
}

// Upgrades a copy of `old` to 21 and checks that both give the same bytes on `feeds`.
Graph upgrade_and_compare(const Graph& old,
                          const std::vector<std::pair<std::string, Tensor>>& feeds) {
  Graph up = old;
  const auto msg = upgrade_default_opset(up, 21, "test");
  EXPECT_TRUE(msg.has_value());
  EXPECT_EQ(up.opset(""), 21);
  up.check();
  const auto a = run(old, feeds);
  const auto b = run(up, feeds);
  EXPECT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    EXPECT_EQ(a[i].dtype(), b[i].dtype()) << "output " << i;
    EXPECT_EQ(a[i].shape(), b[i].shape()) << "output " << i;
    if (a[i].nbytes() == b[i].nbytes()) {
      EXPECT_EQ(0, std::memcmp(a[i].bytes().data(), b[i].bytes().data(), a[i].nbytes()))
          << "output " << i << " differs after the upgrade";
    }
  }
  return up;
}

std::vector<int64_t> ints_of(const Graph& g, const std::string& name) {
  const Tensor* t = g.find_initializer(name);
  EXPECT_NE(t, nullptr) << name;
  if (t == nullptr) return {};
  const auto d = t->data<int64_t>();
  return {d.begin(), d.end()};
}

Graph one(const std::string& op, std::vector<Tensor> inputs, std::vector<Attribute> attrs,
          int64_t opset, size_t outputs = 1) {
  return rt_test::one_node_graph(OneNode{.op = op,
                                         .inputs = std::move(inputs),
                                         .attrs = std::move(attrs),
                                         .outputs = outputs,
                                         .opset = opset});
}

TEST(OpsetUpgrade, ReduceAxesBecomeInputAt18) {
  const Tensor x = random_f32({2, 3, 4}, 1);
  for (const char* op : {"ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
                         "ReduceL2", "ReduceLogSumExp", "ReduceSumSquare"}) {
    SCOPED_TRACE(op);
    const Graph old = one(op, {x}, {attr_ints("axes", {-1}), attr_int("keepdims", 0)}, 17);
    const Graph up = upgrade_and_compare(old, {{"in0", x}});
    const Node& n = up.nodes.at(0);
    ASSERT_EQ(n.inputs.size(), 2u);
    EXPECT_EQ(n.attr("axes"), nullptr);
    EXPECT_EQ(ints_of(up, n.inputs[1]), std::vector<int64_t>{-1});
    EXPECT_EQ(n.attr_int("keepdims", 1), 0);
  }
}

TEST(OpsetUpgrade, ReduceLogSumFromOpset11) {
  const Tensor x = random_f32({2, 3, 4}, 2, 0.5f, 2.0f);
  const Graph old = one("ReduceLogSum", {x}, {attr_ints("axes", {0, 2})}, 11);
  const Graph up = upgrade_and_compare(old, {{"in0", x}});
  EXPECT_EQ(ints_of(up, up.nodes[0].inputs.at(1)), (std::vector<int64_t>{0, 2}));
}

TEST(OpsetUpgrade, ReduceSumAxesBecomeInputAt13AndNoAxesStaysReduceAll) {
  const Tensor x = random_f32({2, 3, 4}, 3);
  const Graph old = one("ReduceSum", {x}, {attr_ints("axes", {1})}, 11);
  const Graph up = upgrade_and_compare(old, {{"in0", x}});
  EXPECT_EQ(ints_of(up, up.nodes[0].inputs.at(1)), std::vector<int64_t>{1});
  const Graph all = one("ReduceMean", {x}, {}, 17);
  const Graph up_all = upgrade_and_compare(all, {{"in0", x}});
  EXPECT_EQ(up_all.nodes[0].inputs.size(), 1u);
}

TEST(OpsetUpgrade, SplitAttributeBecomesInputAndEqualSplitGetsNumOutputs) {
  const Tensor x = random_f32({2, 6}, 4);
  const Graph old = one("Split", {x}, {attr_int("axis", 1), attr_ints("split", {2, 4})}, 11, 2);
  const Graph up = upgrade_and_compare(old, {{"in0", x}});
  EXPECT_EQ(ints_of(up, up.nodes[0].inputs.at(1)), (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(up.nodes[0].attr("num_outputs"), nullptr);

  const Graph equal = one("Split", {x}, {attr_int("axis", 1)}, 17, 3);
  const Graph up_equal = upgrade_and_compare(equal, {{"in0", x}});
  EXPECT_EQ(up_equal.nodes[0].attr_int("num_outputs", 0), 3);
}

TEST(OpsetUpgrade, SqueezeUnsqueezeAxesBecomeInputAt13) {
  const Tensor x = random_f32({2, 1, 3}, 5);
  const Graph sq = one("Squeeze", {x}, {attr_ints("axes", {1})}, 11);
  const Graph up_sq = upgrade_and_compare(sq, {{"in0", x}});
  EXPECT_EQ(ints_of(up_sq, up_sq.nodes[0].inputs.at(1)), std::vector<int64_t>{1});
  const Graph unsq = one("Unsqueeze", {x}, {attr_ints("axes", {0, 4})}, 12);
  const Graph up_unsq = upgrade_and_compare(unsq, {{"in0", x}});
  EXPECT_EQ(ints_of(up_unsq, up_unsq.nodes[0].inputs.at(1)), (std::vector<int64_t>{0, 4}));
}

TEST(OpsetUpgrade, ClipAttributesBecomeScalarInputsOfTheInputType) {
  const Tensor x = random_f32({4, 5}, 6, -2.0f, 2.0f);
  const Graph old = one("Clip", {x}, {attr_float("min", -0.5f), attr_float("max", 0.75f)}, 10);
  const Graph up = upgrade_and_compare(old, {{"in0", x}});
  const Node& n = up.nodes.at(0);
  ASSERT_EQ(n.inputs.size(), 3u);
  const Tensor* lo = up.find_initializer(n.inputs[1]);
  ASSERT_NE(lo, nullptr);
  EXPECT_EQ(lo->dtype(), DType::F32);
  EXPECT_TRUE(lo->shape().empty());
  EXPECT_EQ(lo->data<float>()[0], -0.5f);
  EXPECT_EQ(up.find_initializer(n.inputs[2])->data<float>()[0], 0.75f);

  // Only a min: the old default max (FLT_MAX, which clamps +inf) is written out.
  Tensor inf = f32({3}, {-1.0f, 0.5f, std::numeric_limits<float>::infinity()});
  const Graph only_min = one("Clip", {inf}, {attr_float("min", 0.0f)}, 10);
  const Graph up_min = upgrade_and_compare(only_min, {{"in0", inf}});
  ASSERT_EQ(up_min.nodes[0].inputs.size(), 3u);
  EXPECT_EQ(up_min.find_initializer(up_min.nodes[0].inputs[2])->data<float>()[0],
            std::numeric_limits<float>::max());
  EXPECT_EQ(rt_test::values<float>(run(up_min, {{"in0", inf}})[0]),
            (std::vector<float>{0.0f, 0.5f, std::numeric_limits<float>::max()}));
}

TEST(OpsetUpgrade, ClipOnAValueOfUnknownTypeCastsItsBounds) {
  // The Clip reads the output of Relu, whose dtype no value_info records.
  const Tensor x = random_f32({3, 3}, 7, -2.0f, 2.0f);
  Graph g = one("Clip", {x}, {attr_float("max", 0.5f)}, 10);
  Node relu;
  relu.name = "relu";
  relu.op_type = "Relu";
  relu.inputs = {"in0"};
  relu.outputs = {"r"};
  g.nodes.at(0).inputs[0] = "r";
  g.nodes.insert(g.nodes.begin(), relu);
  const Graph up = upgrade_and_compare(g, {{"in0", x}});
  ASSERT_EQ(up.nodes.size(), 4u);  // Relu, CastLike (min), CastLike (max), Clip
  EXPECT_EQ(up.nodes[1].op_type, "CastLike");
  EXPECT_EQ(up.nodes[2].op_type, "CastLike");
  EXPECT_EQ(up.nodes[3].inputs.at(1), up.nodes[1].outputs[0]);
  EXPECT_EQ(up.nodes[3].inputs.at(2), up.nodes[2].outputs[0]);
}

TEST(OpsetUpgrade, PadAttributesBecomeInputs) {
  // The runtime has no Pad, so this one is checked on its structure.
  Graph g = one(
      "Pad", {f32({1, 2}, {1, 2})},
      {attr_ints("pads", {0, 1, 0, 2}), attr_float("value", 1.5f), attr_string("mode", "constant")},
      10);
  ASSERT_TRUE(upgrade_default_opset(g, 21, "test"));
  const Node& n = g.nodes.at(0);
  ASSERT_EQ(n.inputs.size(), 3u);
  EXPECT_EQ(ints_of(g, n.inputs[1]), (std::vector<int64_t>{0, 1, 0, 2}));
  EXPECT_EQ(g.find_initializer(n.inputs[2])->data<float>()[0], 1.5f);
  EXPECT_EQ(n.attr("pads"), nullptr);
  EXPECT_EQ(n.attr("value"), nullptr);
  ASSERT_NE(n.attr("mode"), nullptr);
  g.check();
}

TEST(OpsetUpgrade, SliceAndDropoutAttributesBecomeInputs) {
  const Tensor x = random_f32({4, 6}, 8);
  const Graph slice =
      one("Slice", {x},
          {attr_ints("starts", {1, 0}), attr_ints("ends", {3, 5}), attr_ints("axes", {0, 1})}, 9);
  const Graph up = upgrade_and_compare(slice, {{"in0", x}});
  ASSERT_EQ(up.nodes[0].inputs.size(), 4u);
  EXPECT_EQ(ints_of(up, up.nodes[0].inputs[2]), (std::vector<int64_t>{3, 5}));

  const Graph drop = one("Dropout", {x}, {attr_float("ratio", 0.3f)}, 11);
  const Graph up_drop = upgrade_and_compare(drop, {{"in0", x}});
  ASSERT_EQ(up_drop.nodes[0].inputs.size(), 2u);
  EXPECT_EQ(up_drop.find_initializer(up_drop.nodes[0].inputs[1])->data<float>()[0], 0.3f);
}

TEST(OpsetUpgrade, SoftmaxOverTheLastAxisKeepsOneNode) {
  const Tensor x = random_f32({2, 3, 4}, 9);
  Graph g = one("Softmax", {x}, {attr_int("axis", 2)}, 11);
  g.inputs[0].shape = std::vector<Dim>{{2, ""}, {3, ""}, {4, ""}};
  const Graph up = upgrade_and_compare(g, {{"in0", x}});
  ASSERT_EQ(up.nodes.size(), 1u);
  EXPECT_EQ(up.nodes[0].attr_int("axis", 0), 2);

  // 2-D with the old default axis 1: the new default (-1) would also do, but it is explicit.
  const Tensor x2 = random_f32({3, 5}, 10);
  Graph g2 = one("LogSoftmax", {x2}, {}, 12);
  g2.inputs[0].shape = std::vector<Dim>{{3, ""}, {5, ""}};
  const Graph up2 = upgrade_and_compare(g2, {{"in0", x2}});
  ASSERT_EQ(up2.nodes.size(), 1u);
  EXPECT_EQ(up2.nodes[0].attr_int("axis", 0), 1);
}

TEST(OpsetUpgrade, SoftmaxOverSeveralAxesIsFlattenedAndReshaped) {
  // Old meaning with axis 1 on 3-D: softmax over the last two dimensions together.
  const Tensor x = random_f32({2, 3, 4}, 11);
  for (const char* op : {"Softmax", "LogSoftmax"}) {
    SCOPED_TRACE(op);
    const Graph g = one(op, {x}, {}, 11);  // rank unknown, default axis 1
    const Graph up = upgrade_and_compare(g, {{"in0", x}});
    ASSERT_EQ(up.nodes.size(), 4u);
    EXPECT_EQ(up.nodes[0].op_type, "Shape");
    EXPECT_EQ(up.nodes[1].op_type, "Flatten");
    EXPECT_EQ(up.nodes[1].attr_int("axis", 0), 1);
    EXPECT_EQ(up.nodes[2].op_type, op);
    EXPECT_EQ(up.nodes[3].op_type, "Reshape");
    EXPECT_EQ(up.nodes[3].outputs[0], "out0");
  }
  // And it is not the same as the opset 13 meaning on the unconverted node.
  Graph raw = one("Softmax", {x}, {}, 11);
  const auto old_out = run(raw, {{"in0", x}});
  raw.set_opset("", 21);
  raw.nodes[0].set_attr(attr_int("axis", 1));
  const auto naive = run(raw, {{"in0", x}});
  EXPECT_NE(0,
            std::memcmp(old_out[0].bytes().data(), naive[0].bytes().data(), old_out[0].nbytes()));
}

TEST(OpsetUpgrade, UpsampleIsRefusedNamingTheNodeAndLeavesTheGraphAlone) {
  Graph g = one("Upsample", {random_f32({1, 1, 2, 2}, 12)}, {}, 9);
  const Graph before = g;
  const auto caught = rt_test::catch_error([&] { upgrade_default_opset(g, 21, "test"); });
  EXPECT_EQ(caught.category, ErrorCategory::Unsupported);
  EXPECT_NE(caught.message.find("Upsample 'n'"), std::string::npos) << caught.message;
  EXPECT_NE(caught.message.find("re-export"), std::string::npos) << caught.message;
  EXPECT_EQ(g.opset(""), 9);
  EXPECT_EQ(g.nodes.size(), before.nodes.size());
}

TEST(OpsetUpgrade, SubgraphNodesAreConvertedToo) {
  Graph body;
  body.name = "then";
  Node reduce;
  reduce.name = "inner_mean";
  reduce.op_type = "ReduceMean";
  reduce.inputs = {"outer_x"};
  reduce.outputs = {"then_out"};
  reduce.set_attr(attr_ints("axes", {0}));
  body.nodes.push_back(reduce);
  body.outputs.push_back({.name = "then_out"});
  Graph g;
  g.set_opset("", 17);
  g.inputs.push_back({.name = "cond", .dtype = DType::Bool});
  g.inputs.push_back({.name = "outer_x", .dtype = DType::F32});
  Node iff;
  iff.name = "if";
  iff.op_type = "If";
  iff.inputs = {"cond"};
  iff.outputs = {"y"};
  Attribute then_branch;
  then_branch.name = "then_branch";
  then_branch.type = AttrType::Graph;
  then_branch.g = std::make_shared<Graph>(body);
  iff.set_attr(then_branch);
  Attribute else_branch = then_branch;
  else_branch.name = "else_branch";
  else_branch.g = std::make_shared<Graph>(body);
  iff.set_attr(else_branch);
  g.nodes.push_back(iff);
  g.outputs.push_back({.name = "y"});
  const auto msg = upgrade_default_opset(g, 21, "test");
  ASSERT_TRUE(msg);
  EXPECT_NE(msg->find("ReduceMean x2"), std::string::npos) << *msg;
  for (const char* branch : {"then_branch", "else_branch"}) {
    const Graph& sub = *g.nodes[0].attr(branch)->g;
    const Node& n = sub.nodes.at(0);
    ASSERT_EQ(n.inputs.size(), 2u) << branch;
    EXPECT_EQ(n.attr("axes"), nullptr);
    EXPECT_EQ(ints_of(sub, n.inputs[1]), std::vector<int64_t>{0});
  }
  // The two branches got distinct initializer names.
  EXPECT_NE(g.nodes[0].attr("then_branch")->g->nodes[0].inputs[1],
            g.nodes[0].attr("else_branch")->g->nodes[0].inputs[1]);
  g.check();
}

TEST(OpsetUpgrade, TopKScatterRoiAlignGridSampleAndDftTakeTheirNewForms) {
  // Not in the runtime: checked on their structure.
  Graph topk = one("TopK", {random_f32({2, 5}, 14)}, {attr_int("k", 3)}, 9, 2);
  ASSERT_TRUE(upgrade_default_opset(topk, 21, "test"));
  EXPECT_EQ(ints_of(topk, topk.nodes[0].inputs.at(1)), std::vector<int64_t>{3});
  EXPECT_EQ(topk.nodes[0].attr("k"), nullptr);

  Graph scatter =
      one("Scatter", {random_f32({2, 2}, 15), rt_test::i64({1, 2}, {0, 1}), random_f32({1, 2}, 16)},
          {attr_int("axis", 0)}, 10);
  ASSERT_TRUE(upgrade_default_opset(scatter, 21, "test"));
  EXPECT_EQ(scatter.nodes[0].op_type, "ScatterElements");
  EXPECT_EQ(scatter.nodes[0].attr_int("axis", 1), 0);

  Graph grid = one("GridSample", {random_f32({1, 1, 2, 2}, 17), random_f32({1, 2, 2, 2}, 18)},
                   {attr_string("mode", "bicubic")}, 16);
  ASSERT_TRUE(upgrade_default_opset(grid, 21, "test"));
  EXPECT_EQ(grid.nodes[0].attr("mode")->s, "cubic");

  Graph roi =
      one("RoiAlign",
          {random_f32({1, 1, 4, 4}, 20), random_f32({1, 4}, 21), rt_test::i64({1}, {0})}, {}, 15);
  ASSERT_TRUE(upgrade_default_opset(roi, 21, "test"));
  EXPECT_EQ(roi.nodes[0].attr("coordinate_transformation_mode")->s, "output_half_pixel");

  Graph dft = one("DFT", {random_f32({1, 8, 1}, 19)}, {}, 17);
  ASSERT_TRUE(upgrade_default_opset(dft, 21, "test"));
  ASSERT_EQ(dft.nodes[0].inputs.size(), 3u);
  EXPECT_EQ(dft.nodes[0].inputs[1], "");
  const Tensor* axis = dft.find_initializer(dft.nodes[0].inputs[2]);
  ASSERT_NE(axis, nullptr);
  EXPECT_TRUE(axis->shape().empty());
  EXPECT_EQ(axis->data<int64_t>()[0], 1) << "the old default axis, explicit (the new one is -2)";
}

TEST(OpsetUpgrade, RefusalInsideASubgraphNamesTheIfNode) {
  Graph body;
  Node bn;
  bn.name = "bn_train";
  bn.op_type = "BatchNormalization";
  bn.inputs = {"x", "s", "b", "m", "v"};
  bn.outputs = {"y", "mean_out", "var_out"};
  body.nodes.push_back(bn);
  Graph g;
  g.set_opset("", 12);
  Node iff;
  iff.name = "branch";
  iff.op_type = "If";
  Attribute a;
  a.name = "then_branch";
  a.type = AttrType::Graph;
  a.g = std::make_shared<Graph>(body);
  iff.set_attr(a);
  g.nodes.push_back(iff);
  const auto caught = rt_test::catch_error([&] { upgrade_default_opset(g, 21, "test"); });
  EXPECT_EQ(caught.category, ErrorCategory::Unsupported);
  EXPECT_NE(caught.message.find("If 'branch' > BatchNormalization 'bn_train'"), std::string::npos)
      << caught.message;
  EXPECT_EQ(g.opset(""), 12);
}

TEST(OpsetUpgrade, NothingToDoAtOrAboveTheTarget) {
  Graph g = one("ReduceMean", {random_f32({2, 2}, 13)}, {}, 21);
  EXPECT_FALSE(upgrade_default_opset(g, 21, "test"));
  EXPECT_FALSE(raise_default_opset(g, 13, "test"));
  EXPECT_EQ(g.opset(""), 21);
}

}  // namespace
}  // namespace qforge
