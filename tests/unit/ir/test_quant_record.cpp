// The Graph's quantized-tensor records: one per stored tensor, kept in order, following renames
// and removals, and checked against the nodes before an exporter trusts them.
#include <gtest/gtest.h>

#include "ir/error.h"
#include "ir/graph.h"

using namespace qforge;

namespace {

Node make_node(std::string op, std::vector<std::string> in, std::vector<std::string> out) {
  Node n;
  n.name = op + "_" + out[0];
  n.op_type = std::move(op);
  n.inputs = std::move(in);
  n.outputs = std::move(out);
  return n;
}

// x @ DequantizeLinear(wq, ws, wz) -> y, with wq's record.
Graph quantized_matmul() {
  Graph g;
  g.inputs.push_back({.name = "x", .dtype = DType::F32});
  g.set_initializer("wq", Tensor(DType::I8, {4, 3}));
  g.set_initializer("ws", Tensor(DType::F32, {3}));
  g.set_initializer("wz", Tensor(DType::I8, {3}));
  g.nodes.push_back(make_node("DequantizeLinear", {"wq", "ws", "wz"}, {"wf"}));
  g.nodes.push_back(make_node("MatMul", {"x", "wf"}, {"y"}));
  g.outputs.push_back({.name = "y"});
  g.add_quant_record({.name = "wq",
                      .source = "w",
                      .dtype = DType::I8,
                      .bits = 8,
                      .axis = 1,
                      .scale = "ws",
                      .zero_point = "wz",
                      .reader = "wf"});
  return g;
}

std::string internal_error(const Graph& g) {
  try {
    g.check_quant_records();
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), ErrorCategory::Internal);
    return e.what();
  }
  ADD_FAILURE() << "check_quant_records accepted a contradicting record";
  return "";
}

TEST(QuantRecord, GranularityFollowsAxisAndBlock) {
  QuantRecord r;
  EXPECT_EQ(r.granularity(), QuantGranularity::PerTensor);
  r.axis = 0;
  EXPECT_EQ(r.granularity(), QuantGranularity::PerChannel);
  r.block_size = 32;
  EXPECT_EQ(r.granularity(), QuantGranularity::Blocked);
  EXPECT_EQ(quant_granularity_name(r.granularity()), "blocked");
  EXPECT_EQ(quant_kind_name(QuantKind::Activation), "activation");
  EXPECT_EQ(quant_packing_name(QuantPacking::MatMulNBits), "matmulnbits");
}

TEST(QuantRecord, GraphKeepsOneRecordPerNameInInsertionOrder) {
  Graph g = quantized_matmul();
  g.add_quant_record({.name = "other", .scale = "s", .reader = "r"});
  QuantRecord replaced = g.quant_records()[0];
  replaced.axis.reset();
  g.add_quant_record(replaced);
  ASSERT_EQ(g.quant_records().size(), 2u);
  EXPECT_EQ(g.quant_records()[0].name, "wq") << "a replaced record keeps its place";
  EXPECT_FALSE(g.quant_records()[0].axis);
  EXPECT_EQ(g.quant_records()[1].name, "other");
  ASSERT_NE(g.find_quant_record("other"), nullptr);
  EXPECT_EQ(g.find_quant_record("missing"), nullptr);
  const Graph copy = g;
  EXPECT_EQ(copy.quant_records(), g.quant_records());
}

TEST(QuantRecord, RemovingTheStoredTensorDropsItsRecordOnly) {
  Graph g = quantized_matmul();
  g.set_initializer("w", Tensor(DType::F32, {4, 3}));
  g.remove_initializer("w");  // the float source: the record stays
  ASSERT_EQ(g.quant_records().size(), 1u);
  g.remove_initializer("ws");  // a scale: the record stays (and now contradicts the graph)
  ASSERT_EQ(g.quant_records().size(), 1u);
  g.remove_initializer("wq");
  EXPECT_TRUE(g.quant_records().empty());
}

TEST(QuantRecord, RenamesAndRetargetsFollowTheGraph) {
  Graph g = quantized_matmul();
  g.rename_in_quant_records("wf", "wf2");
  EXPECT_EQ(g.quant_records()[0].reader, "wf2");
  g.retarget_quant_records("elsewhere", "ws", "ws_f16");
  EXPECT_EQ(g.quant_records()[0].scale, "ws") << "another reader's input changed";
  g.retarget_quant_records("wf2", "ws", "ws_f16");
  EXPECT_EQ(g.quant_records()[0].scale, "ws_f16");
  EXPECT_EQ(g.quant_records()[0].reader, "wf2");
}

TEST(QuantRecord, CheckAcceptsATrueRecordAndNamesEachContradiction) {
  Graph g = quantized_matmul();
  EXPECT_NO_THROW(g.check_quant_records());

  Graph no_reader = g;
  no_reader.rename_in_quant_records("wf", "gone");
  EXPECT_NE(internal_error(no_reader).find("reader 'gone'"), std::string::npos);

  Graph other_scale = g;
  other_scale.nodes[0].inputs[1] = "ws2";
  other_scale.set_initializer("ws2", Tensor(DType::F32, {3}));
  const std::string message = internal_error(other_scale);
  EXPECT_NE(message.find("weight record 'wq'"), std::string::npos) << message;
  EXPECT_NE(message.find("does not read 'ws'"), std::string::npos) << message;

  Graph not_constant = g;
  not_constant.remove_initializer("wq");
  not_constant.add_quant_record(g.quant_records()[0]);
  not_constant.inputs.push_back({.name = "wq", .dtype = DType::I8});
  EXPECT_NE(internal_error(not_constant).find("no initializer"), std::string::npos);
}

}  // namespace
