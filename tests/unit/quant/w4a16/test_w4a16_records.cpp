// The records W4A16 attaches, in both formats: blocked int4 read by DequantizeLinear, and
// MatMulNBits' packed B.
#include <gtest/gtest.h>

#include "tests/unit/quant/quant_record_checks.h"
#include "tests/unit/quant/w4a16/w4a16_fixtures.h"

using namespace qforge;
using namespace qforge::test::w4a16;
using namespace qforge::test::records;

namespace {

W4A16Options both_layers(Int4Format format) {
  W4A16Options options;
  options.block_size = 32;
  options.format = format;
  options.exclude_output_projection = false;  // fc2 too
  options.scale = Int4Scale::Amax;
  return options;
}

}  // namespace

TEST(W4A16Records, BlockedRecordsDescribeInt4ScalesAndTheirDequantize) {
  Graph g = mlp(/*k=*/80, /*hidden=*/32, /*n=*/16);
  run_pass(g, both_layers(Int4Format::OnnxBlocked));
  ASSERT_EQ(g.quant_records().size(), 2u);
  const QuantRecord& r = g.quant_records()[0];
  EXPECT_EQ(r.kind, QuantKind::Weight);
  EXPECT_EQ(r.name, "w1_int4");
  EXPECT_EQ(r.source, "w1");
  EXPECT_EQ(r.dtype, DType::I4);
  EXPECT_EQ(r.bits, 4);
  EXPECT_EQ(r.axis, 0);
  EXPECT_EQ(r.block_size, 32);
  EXPECT_EQ(r.granularity(), QuantGranularity::Blocked);
  EXPECT_EQ(r.scale, "w1_scale");
  EXPECT_EQ(r.zero_point, "");
  EXPECT_EQ(g.find_initializer(r.scale)->dtype(), DType::F16);
  expect_dequantize_record(g, r, Shape{3, 32});  // ceil(80 / 32) blocks of w1 [80, 32]
  expect_feeds(g, r, "fc1", 1);
  EXPECT_EQ(g.quant_records()[1].name, "w2_int4");
  expect_dequantize_record(g, g.quant_records()[1], Shape{1, 16});
  expect_feeds(g, g.quant_records()[1], "fc2", 1);
}

TEST(W4A16Records, GemmWithTransBIsBlockedAlongAxis1) {
  Graph g = mlp(64, 32, 16);
  g.set_initializer("w1", random_weight({32, 64}, 5));  // [N, K]
  g.nodes[0].op_type = "Gemm";
  g.nodes[0].set_attr(Attribute::make_int("transB", 1));
  run_pass(g, both_layers(Int4Format::MatMulNBits));  // Gemm keeps the blocked form
  const QuantRecord& r = g.quant_records()[0];
  EXPECT_EQ(r.source, "w1");
  EXPECT_EQ(r.axis, 1);
  EXPECT_EQ(r.packing, QuantPacking::Onnx);
  expect_dequantize_record(g, r, Shape{32, 2});
  expect_feeds(g, r, "fc1", 1);
  EXPECT_EQ(g.quant_records()[1].packing, QuantPacking::MatMulNBits);
}

TEST(W4A16Records, MatMulNBitsRecordsDescribeThePackedWeight) {
  Graph g = mlp(/*k=*/80, /*hidden=*/32, /*n=*/16);
  run_pass(g, both_layers(Int4Format::MatMulNBits));
  ASSERT_EQ(g.quant_records().size(), 2u);
  const QuantRecord& r = g.quant_records()[0];
  EXPECT_EQ(r.kind, QuantKind::Weight);
  EXPECT_EQ(r.name, "w1_nbits");
  EXPECT_EQ(r.source, "w1");
  EXPECT_EQ(r.dtype, DType::U4);
  EXPECT_EQ(r.bits, 4);
  EXPECT_EQ(r.axis, 0);
  EXPECT_EQ(r.block_size, 32);
  EXPECT_EQ(r.scale, "w1_nbits_scale");
  EXPECT_EQ(r.zero_point, "");
  EXPECT_EQ(r.packing, QuantPacking::MatMulNBits);
  EXPECT_EQ(r.reader, "h") << "the MatMulNBits that replaced fc1";
  const Node* fc1 = node_producing(g, r.reader);
  ASSERT_NE(fc1, nullptr);
  EXPECT_EQ(fc1->name, "fc1");
  EXPECT_EQ(fc1->op_type, "MatMulNBits");
  EXPECT_EQ(fc1->inputs, (std::vector<std::string>{"x", r.name, r.scale}));
  EXPECT_EQ(fc1->attr_int("bits", 0), r.bits);
  EXPECT_EQ(fc1->attr_int("block_size", 0), r.block_size);
  EXPECT_EQ(g.find_initializer(r.name)->shape(), (Shape{32, 3, 16}));  // [N, blocks, 32 / 2]
  EXPECT_EQ(g.find_initializer(r.scale)->shape(), Shape{32 * 3});
  EXPECT_EQ(g.quant_records()[1].reader, "y");
  EXPECT_NO_THROW(g.check_quant_records());
}
