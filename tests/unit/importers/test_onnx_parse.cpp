#include <gtest/gtest.h>

#include "exporters/onnx/onnx_exporter.h"
#include "importers/onnx/onnx_importer.h"
#include "importers/onnx/onnx_parse.h"
#include "tests/unit/exporters/graph_compare.h"
#include "tests/unit/exporters/onnx_test_util.h"

using namespace qforge;
using namespace qforge::testing;

namespace {

std::span<const std::byte> as_span(const std::string& s) {
  return std::as_bytes(std::span(s.data(), s.size()));
}

std::string varint(uint64_t v) {
  std::string out;
  while (v >= 0x80) {
    out += static_cast<char>((v & 0x7f) | 0x80);
    v >>= 7;
  }
  return out + static_cast<char>(v);
}

std::string length_delimited(int field, const std::string& payload) {
  return varint(static_cast<uint64_t>(field) << 3 | 2) + varint(payload.size()) + payload;
}

// An unknown, empty group (wire types 3 and 4): protobuf skips it, the splitter declines it,
// so the model takes the whole-protobuf path.
std::string unknown_group(int field) {
  return varint(static_cast<uint64_t>(field) << 3 | 3) + varint(static_cast<uint64_t>(field) << 3 | 4);
}

}  // namespace

TEST(OnnxParse, SplitFindsGraphAndRawDataInsideTheInput) {
  TempDir dir;
  const Graph g = make_mlp();
  export_onnx(g, dir / "m.onnx");
  const std::string bytes = read_bytes(dir / "m.onnx");
  const auto split = split_onnx_model(as_span(bytes));
  ASSERT_TRUE(split.has_value());
  onnx::ModelProto model;
  ASSERT_TRUE(model.ParseFromString(split->model));
  EXPECT_FALSE(model.has_graph());
  EXPECT_EQ(model.producer_name(), "qforge-test");
  onnx::GraphProto graph;
  ASSERT_TRUE(graph.ParseFromString(split->graph));
  EXPECT_EQ(graph.initializer_size(), 0);
  EXPECT_EQ(graph.node_size(), 4);
  ASSERT_EQ(split->initializers.size(), 4u);
  for (size_t i = 0; i < split->initializers.size(); ++i) {
    const auto& init = split->initializers[i];
    onnx::TensorProto t;
    ASSERT_TRUE(t.ParseFromString(init.proto));
    EXPECT_FALSE(t.has_raw_data());
    EXPECT_EQ(t.name(), g.initializers()[i].first);
    ASSERT_TRUE(init.raw_data.has_value());
    const auto expected = g.initializers()[i].second.bytes();
    ASSERT_EQ(init.raw_data->size(), expected.size());
    EXPECT_EQ(std::memcmp(init.raw_data->data(), expected.data(), expected.size()), 0);
    EXPECT_GE(init.raw_data->data(), as_span(bytes).data());  // a window, not a copy
    EXPECT_LE(init.raw_data->data() + init.raw_data->size(), as_span(bytes).data() + bytes.size());
  }
}

TEST(OnnxParse, SplitDeclinesMalformedOrUnusualBytes) {
  EXPECT_FALSE(split_onnx_model(as_span(std::string("\x08", 1))));          // cut varint
  EXPECT_FALSE(split_onnx_model(as_span(std::string("\x3a\x05gr", 4))));    // length past end
  EXPECT_FALSE(split_onnx_model(as_span(std::string("\x08\x08", 2))));      // no graph
  EXPECT_FALSE(split_onnx_model(as_span(unknown_group(100) + length_delimited(7, ""))));
  EXPECT_FALSE(split_onnx_model(as_span(length_delimited(7, "") + length_delimited(7, ""))));
  EXPECT_TRUE(split_onnx_model(as_span(std::string("\x08\x08", 2) + length_delimited(7, ""))));
}

TEST(OnnxParse, WholeProtobufPathGivesTheSameGraph) {
  TempDir dir;
  Graph g = make_mlp(64);
  g.set_initializer("i4", iota_tensor(DType::I4, {5}));
  g.set_initializer("empty", Tensor(DType::F16, {0}));
  export_onnx(g, dir / "m.onnx");
  const std::string bytes = read_bytes(dir / "m.onnx");
  write_bytes(dir / "unusual.onnx", bytes + unknown_group(1000));
  ASSERT_FALSE(split_onnx_model(as_span(bytes + unknown_group(1000))));
  expect_graph_equal(import_onnx(dir / "m.onnx"), import_onnx(dir / "unusual.onnx"));
  expect_graph_equal(g, import_onnx(dir / "unusual.onnx"));
}

TEST(OnnxParse, GraphSplitAcrossTwoFieldsIsMergedAsProtobufDoes) {
  TempDir dir;
  const Graph g = make_mlp();
  export_onnx(g, dir / "m.onnx");
  onnx::ModelProto model = read_proto(dir / "m.onnx");
  onnx::GraphProto inits;
  inits.mutable_initializer()->Swap(model.mutable_graph()->mutable_initializer());
  write_bytes(dir / "two.onnx", model.SerializeAsString() + length_delimited(7, inits.SerializeAsString()));
  expect_graph_equal(g, import_onnx(dir / "two.onnx"));
}

TEST(OnnxParse, RepeatedRawDataLastOneWinsAsInProtobuf) {
  TempDir dir;
  onnx::ModelProto model;
  model.set_ir_version(8);
  model.add_opset_import()->set_version(17);
  auto& graph = *model.mutable_graph();
  graph.add_output()->set_name("w");
  onnx::TensorProto t;
  t.set_name("w");
  t.set_data_type(1);
  t.add_dims(1);
  t.set_raw_data("AAAA");
  const std::string tensor = t.SerializeAsString() + length_delimited(9, "BBBB");
  write_bytes(dir / "m.onnx", model.SerializeAsString() +
                                  length_delimited(7, length_delimited(5, tensor)));
  const Graph g = import_onnx(dir / "m.onnx");
  const auto b = g.find_initializer("w")->bytes();
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(b.data()), b.size()), "BBBB");
}

TEST(OnnxParse, ParseFailureNamesSourceAndByte) {
  expect_error([] { parse_onnx_model(as_span(std::string("\x3a\x05gr", 4)), "x.onnx"); },
               ErrorCategory::InvalidInput, {"'x.onnx'", "not a valid ONNX model", "near byte"});
}
