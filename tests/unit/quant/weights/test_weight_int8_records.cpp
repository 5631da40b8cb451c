// The record weight-int8 attaches to each weight it quantizes describes what it wrote.
#include <gtest/gtest.h>

#include "tests/unit/quant/quant_record_checks.h"
#include "tests/unit/quant/weights/weight_int8_fixtures.h"

using namespace qforge;
using namespace qforge::test;
using namespace qforge::test::records;

TEST(WeightInt8Records, PerChannelRecordDescribesTheWrittenTensors) {
  Graph g = single_op("Conv", random_weight({8, 3, 3, 3}, 1));
  run_pass(g);
  ASSERT_EQ(g.quant_records().size(), 1u);
  const QuantRecord& r = g.quant_records()[0];
  EXPECT_EQ(r.kind, QuantKind::Weight);
  EXPECT_EQ(r.name, "w_quantized");
  EXPECT_EQ(r.source, "w");
  EXPECT_EQ(r.dtype, DType::I8);
  EXPECT_EQ(r.bits, 8);
  EXPECT_EQ(r.axis, 0);
  EXPECT_EQ(r.block_size, 0);
  EXPECT_EQ(r.granularity(), QuantGranularity::PerChannel);
  EXPECT_EQ(r.scale, "w_scale");
  EXPECT_EQ(r.zero_point, "w_zero_point");
  EXPECT_EQ(r.reader, "w_dequantized");
  expect_dequantize_record(g, r, Shape{8});
  expect_feeds(g, r, "Conv_0", 1);
}

TEST(WeightInt8Records, AxisPerOpTypeAndPerTensorMode) {
  struct Case {
    std::string op;
    Shape shape;
    std::vector<Attribute> attrs;
    int64_t axis;
  };
  const std::vector<Case> cases = {
      {"ConvTranspose", {3, 5, 2, 2}, {}, 1},
      {"Gemm", {6, 4}, {Attribute::make_int("transB", 1)}, 0},
      {"Gemm", {4, 6}, {}, 1},
      {"MatMul", {2, 5, 3}, {}, 2},
  };
  for (const Case& c : cases) {
    for (bool per_tensor : {false, true}) {
      SCOPED_TRACE(c.op + " " + shape_to_string(c.shape) + (per_tensor ? " per-tensor" : ""));
      Graph g = single_op(c.op, random_weight(c.shape, 2), c.attrs);
      WeightInt8Options options;
      options.per_tensor = per_tensor;
      run_pass(g, options);
      ASSERT_EQ(g.quant_records().size(), 1u);
      const QuantRecord& r = g.quant_records()[0];
      if (per_tensor) {
        EXPECT_FALSE(r.axis);
        EXPECT_EQ(r.granularity(), QuantGranularity::PerTensor);
        expect_dequantize_record(g, r, Shape{});
      } else {
        EXPECT_EQ(r.axis, c.axis);
        expect_dequantize_record(g, r, Shape{c.shape[static_cast<size_t>(c.axis)]});
      }
      expect_feeds(g, r, c.op + "_0", 1);
    }
  }
}

TEST(WeightInt8Records, HalfWeightFeedsItsLayerThroughTheCast) {
  Graph g = single_op("MatMul", random_weight({16, 4}, 3, DType::F16));
  run_pass(g);
  ASSERT_EQ(g.quant_records().size(), 1u);
  const QuantRecord& r = g.quant_records()[0];
  EXPECT_EQ(r.source, "w");
  expect_dequantize_record(g, r, Shape{4});
  expect_feeds(g, r, "MatMul_0", 1);
  EXPECT_NE(find_node(g, "MatMul_0")->inputs[1], r.reader) << "a Cast back to f16 sits between";
}

TEST(WeightInt8Records, OneRecordPerQuantizedCopyOfASharedWeight) {
  // w read by a MatMul (axis 1) and a Gemm with transB (axis 0): two int8 copies, two records.
  Graph g = single_op("MatMul", random_weight({4, 4}, 4));
  g.nodes.push_back(make_node("Gemm_0", "Gemm", {"y", "w"}, {"z"},
                              {Attribute::make_int("transB", 1)}));
  g.outputs = {{.name = "z"}};
  run_pass(g);
  ASSERT_EQ(g.quant_records().size(), 2u);
  EXPECT_EQ(g.quant_records()[0].axis, 1);
  EXPECT_EQ(g.quant_records()[1].axis, 0);
  EXPECT_NE(g.quant_records()[0].name, g.quant_records()[1].name);
  expect_feeds(g, g.quant_records()[0], "MatMul_0", 1);
  expect_feeds(g, g.quant_records()[1], "Gemm_0", 1);
  for (const QuantRecord& r : g.quant_records()) expect_dequantize_record(g, r, Shape{4});
}
