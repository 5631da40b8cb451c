// A model a qforge pass quantized, written to ONNX and read back, carries the same
// quantized-tensor records as before (the weights' former names aside, which the file does not
// hold), and a bundle made from either lists the same tensors.
#include <gtest/gtest.h>

#include <map>

#include "exporters/bundle/bundle_writer.h"
#include "exporters/onnx/onnx_exporter.h"
#include "importers/onnx/onnx_importer.h"
#include "importers/onnx/onnx_quant_records.h"
#include "tests/unit/quant/static/static_fixtures.h"
#include "tests/unit/quant/w4a16/w4a16_fixtures.h"
#include "tests/unit/temp_dir.h"

namespace qforge {
namespace {

namespace int8 = qforge::test;
namespace w4 = qforge::test::w4a16;

ValueInfo f32_value(std::string name, const std::vector<int64_t>& dims) {
  std::vector<Dim> shape;
  for (int64_t d : dims) shape.push_back(Dim{.value = d});
  return {.name = std::move(name), .dtype = DType::F32, .shape = shape};
}

void expect_records_survive_onnx(const Graph& quantized) {
  ASSERT_FALSE(quantized.quant_records().empty());
  const test::TempDir dir;
  export_onnx(quantized, dir.path() / "q.onnx");
  const Graph back = import_onnx(dir.path() / "q.onnx");
  ASSERT_EQ(back.quant_records().size(), quantized.quant_records().size());
  for (const QuantRecord& written : quantized.quant_records()) {
    SCOPED_TRACE("record '" + written.name + "'");
    const QuantRecord* read = back.find_quant_record(written.name);
    ASSERT_NE(read, nullptr);
    QuantRecord expected = written;
    if (written.kind == QuantKind::Weight) {  // the float weight's name is not in the file
      expected.source = written.packing == QuantPacking::Onnx ? written.reader : written.name;
    }
    EXPECT_EQ(*read, expected);
  }
  EXPECT_NO_THROW(back.check_quant_records());
  EXPECT_EQ(bundle_quantized_tensors(back), bundle_quantized_tensors(quantized));
}

TEST(OnnxQuantRecords, WeightInt8PerChannelAndPerTensorReadBackEqual) {
  for (bool per_tensor : {false, true}) {
    SCOPED_TRACE(per_tensor ? "per-tensor" : "per-channel");
    Graph g = int8::single_op("Conv", int8::random_weight({8, 3, 3, 3}, 1));
    g.name = "conv_matmul";
    g.inputs = {f32_value("x", {1, 3, 8, 8})};
    g.set_initializer("w2", int8::random_weight({6, 5}, 2));
    g.nodes.push_back(int8::make_node("MatMul_0", "MatMul", {"y", "w2"}, {"z"}));
    g.outputs = {f32_value("z", {1, 8, 6, 5})};
    WeightInt8Options options;
    options.per_tensor = per_tensor;
    int8::run_pass(g, options);
    expect_records_survive_onnx(g);
  }
}

TEST(OnnxQuantRecords, StaticInt8ActivationsWeightsAndBiasesReadBackEqual) {
  Graph g = int8::single_op("Conv", int8::random_weight({4, 3, 3, 3}, 3));
  g.name = "conv_pool";
  g.inputs = {f32_value("x", {1, 3, 8, 8})};
  g.set_initializer("b", int8::random_weight({4}, 4));
  g.nodes[0].inputs.emplace_back("b");
  g.nodes.push_back(int8::make_node("Relu_0", "Relu", {"y"}, {"r"}));
  g.nodes.push_back(int8::make_node("Pool_0", "GlobalAveragePool", {"r"}, {"p"}));
  g.outputs = {f32_value("p", {1, 4, 1, 1})};
  StaticInt8Options options;
  options.activation_amax = {{"x", 2.0f}, {"r", 3.0f}};
  options.int32_bias = true;
  int8::run_static(g, options);
  ASSERT_EQ(g.quant_records().size(), 4u);  // x, w, b, r
  expect_records_survive_onnx(g);
}

TEST(OnnxQuantRecords, W4A16BothFormatsReadBackEqual) {
  for (Int4Format format : {Int4Format::OnnxBlocked, Int4Format::MatMulNBits}) {
    SCOPED_TRACE(std::string(int4_format_name(format)));
    Graph g = w4::mlp(80, 32, 16);
    W4A16Options options;
    options.block_size = 32;
    options.format = format;
    options.exclude_output_projection = false;
    w4::run_pass(g, options);
    ASSERT_EQ(g.quant_records().size(), 2u);
    expect_records_survive_onnx(g);
  }
}

TEST(OnnxQuantRecords, ModelQuantizedElsewhereIsDescribedFromItsNodes) {
  // An activation pair without a zero point (u8 by ONNX's rule), a per-channel weight given
  // axis -1, and a MatMulNBits with zero points.
  Graph g;
  g.set_opset("", 21);
  g.set_opset("com.microsoft", 1);
  g.inputs.push_back({.name = "x", .dtype = DType::F32});
  g.set_initializer("xs", Tensor(DType::F32, {}));
  g.set_initializer("wq", Tensor(DType::I8, {16, 4}));
  g.set_initializer("ws", Tensor(DType::F32, {4}));
  g.set_initializer("b", Tensor(DType::U8, {4, 1, 8}));
  g.set_initializer("bs", Tensor(DType::F32, {4}));
  g.set_initializer("bz", Tensor(DType::U8, {4}));
  g.nodes.push_back(int8::make_node("q", "QuantizeLinear", {"x", "xs"}, {"xq"}));
  g.nodes.push_back(int8::make_node("dq", "DequantizeLinear", {"xq", "xs"}, {"xf"}));
  g.nodes.push_back(int8::make_node("dqw", "DequantizeLinear", {"wq", "ws"}, {"wf"},
                                    {Attribute::make_int("axis", -1)}));
  g.nodes.push_back(int8::make_node("mm", "MatMul", {"xf", "wf"}, {"h"}));
  Node nbits = int8::make_node("nb", "MatMulNBits", {"h", "b", "bs", "bz"}, {"y"},
                               {Attribute::make_int("K", 4), Attribute::make_int("N", 4),
                                Attribute::make_int("bits", 4),
                                Attribute::make_int("block_size", 16)});
  nbits.domain = "com.microsoft";
  g.nodes.push_back(nbits);
  g.outputs.push_back({.name = "y"});
  const std::vector<QuantRecord> records = onnx_quant_records(g);
  ASSERT_EQ(records.size(), 3u);
  EXPECT_EQ(records[0], (QuantRecord{.kind = QuantKind::Activation,
                                     .name = "xq",
                                     .source = "x",
                                     .dtype = DType::U8,
                                     .bits = 8,
                                     .scale = "xs",
                                     .reader = "xf"}));
  EXPECT_EQ(records[1], (QuantRecord{.kind = QuantKind::Weight,
                                     .name = "wq",
                                     .source = "wf",
                                     .dtype = DType::I8,
                                     .bits = 8,
                                     .axis = 1,
                                     .scale = "ws",
                                     .reader = "wf"}));
  EXPECT_EQ(records[2], (QuantRecord{.kind = QuantKind::Weight,
                                     .name = "b",
                                     .source = "b",
                                     .dtype = DType::U4,
                                     .bits = 4,
                                     .axis = 0,
                                     .block_size = 16,
                                     .scale = "bs",
                                     .zero_point = "bz",
                                     .packing = QuantPacking::MatMulNBits,
                                     .reader = "y"}));
}

}  // namespace
}  // namespace qforge
