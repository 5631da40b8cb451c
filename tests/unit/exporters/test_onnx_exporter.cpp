#include <gtest/gtest.h>

#include "exporters/onnx/onnx_exporter.h"
#include "importers/onnx/onnx_importer.h"
#include "tests/unit/exporters/graph_compare.h"
#include "tests/unit/exporters/onnx_test_util.h"

using namespace qforge;
using namespace qforge::testing;

namespace {

std::shared_ptr<Graph> branch(const std::string& name, const std::string& op,
                              const std::string& out) {
  auto g = std::make_shared<Graph>();
  g->name = name;
  g->doc_string = name + " doc";
  g->set_initializer(name + "_k", f32_tensor({2.0f, 3.0f}, {2}));
  g->nodes.push_back(make_node(name + "_op", op, {"x", name + "_k"}, {name + "_t"}));
  g->nodes.push_back(make_node(name + "_mul", "Mul", {name + "_t", "w"}, {out}));
  g->outputs.push_back(tensor_info(out, DType::F32, {{.value = 2}}));
  return g;
}

Attribute attr(std::string name, AttrType type) {
  Attribute a;
  a.name = std::move(name);
  a.type = type;
  return a;
}

// An If with two branches reading outer values, then a custom-domain node carrying one
// attribute of every type.
Graph make_all_attributes() {
  Graph g;
  g.name = "attrs";
  g.model.ir_version = 8;
  g.set_opset("", 17);
  g.set_opset("com.qforge.test", 1);
  g.inputs.push_back(tensor_info("cond", DType::Bool, {}));
  g.inputs.push_back(tensor_info("x", DType::F32, {{.value = 2}}));
  g.outputs.push_back(tensor_info("out", DType::F32, {{.value = 2}}));
  g.set_initializer("w", f32_tensor({0.5f, -1.5f}, {2}));

  Attribute then_branch = attr("then_branch", AttrType::Graph);
  then_branch.g = branch("then", "Add", "then_out");
  Attribute else_branch = attr("else_branch", AttrType::Graph);
  else_branch.g = branch("else", "Sub", "else_out");
  g.nodes.push_back(make_node("if", "If", {"cond"}, {"z"}, {then_branch, else_branch}));

  std::vector<Attribute> all;
  all.push_back(Attribute::make_float("f", -2.5f));
  all.back().doc_string = "a float";
  all.push_back(Attribute::make_int("i", -(int64_t{1} << 40)));
  all.push_back(Attribute::make_string("s", std::string("bytes\0with nul", 14)));
  Attribute t = attr("t", AttrType::Tensor);
  t.t = iota_tensor(DType::I8, {2, 3});
  all.push_back(t);
  Attribute sub = attr("g", AttrType::Graph);
  sub.g = branch("single", "Add", "single_out");
  all.push_back(sub);
  Attribute floats = attr("floats", AttrType::Floats);
  floats.floats = {1.0f, -0.0f, 3.25e-20f};
  all.push_back(floats);
  all.push_back(Attribute::make_ints("ints", {0, -1, int64_t{1} << 62}));
  Attribute strings = attr("strings", AttrType::Strings);
  strings.strings = {"a", "", "long string"};
  all.push_back(strings);
  Attribute tensors = attr("tensors", AttrType::Tensors);
  tensors.tensors = {iota_tensor(DType::F16, {3}), iota_tensor(DType::BF16, {1, 2}),
                     iota_tensor(DType::U4, {3})};
  all.push_back(tensors);
  Attribute graphs = attr("graphs", AttrType::Graphs);
  graphs.graphs = {branch("first", "Add", "first_out"), branch("second", "Sub", "second_out")};
  all.push_back(graphs);
  g.nodes.push_back(make_node("all", "AllAttrs", {"z"}, {"out"}, all));
  g.nodes.back().domain = "com.qforge.test";
  return g;
}

// One initializer of every dtype, plus a scalar and an empty tensor.
Graph make_all_dtypes() {
  Graph g = make_mlp();
  for (const auto& info : kDTypes) {
    const Shape shape = info.bits == 4 ? Shape{5} : Shape{2, 3};  // odd count: half a byte
    g.set_initializer("init_" + std::string(info.name), iota_tensor(info.dtype, shape));
  }
  g.set_initializer("scalar", f32_tensor({42.0f}, {}));
  g.set_initializer("empty", Tensor(DType::F32, {0, 3}));
  return g;
}

}  // namespace

TEST(OnnxExporter, RoundTripKeepsModelGraphAndValueFields) {
  TempDir dir;
  const Graph g = make_mlp();
  export_onnx(g, dir / "mlp.onnx");
  const Graph back = import_onnx(dir / "mlp.onnx");
  expect_graph_equal(g, back);
  EXPECT_EQ(back.model.producer_name, "qforge-test");
  ASSERT_EQ(back.inputs.size(), 1u);
  EXPECT_EQ((*back.inputs[0].shape)[0].param, "batch");
  EXPECT_EQ(back.value_info[0].shape->at(0), Dim{});
}

TEST(OnnxExporter, RoundTripKeepsEveryDtype) {
  TempDir dir;
  const Graph g = make_all_dtypes();
  export_onnx(g, dir / "dtypes.onnx");
  const Graph back = import_onnx(dir / "dtypes.onnx");
  expect_graph_equal(g, back);
  EXPECT_EQ(back.find_initializer("scalar")->to_f32(), std::vector<float>{42.0f});
  EXPECT_EQ(back.find_initializer("empty")->numel(), 0u);
}

TEST(OnnxExporter, RoundTripKeepsEveryAttributeTypeAndSubgraphs) {
  TempDir dir;
  const Graph g = make_all_attributes();
  export_onnx(g, dir / "attrs.onnx");
  const Graph back = import_onnx(dir / "attrs.onnx");
  expect_graph_equal(g, back);
  const Attribute* then_branch = back.nodes[0].attr("then_branch");
  ASSERT_NE(then_branch, nullptr);
  ASSERT_NE(then_branch->g, nullptr);
  EXPECT_EQ(then_branch->g->nodes[0].op_type, "Add");
  EXPECT_EQ(then_branch->g->find_initializer("then_k")->to_f32(), (std::vector<float>{2.0f, 3.0f}));
  EXPECT_EQ(back.nodes[1].attr("s")->s.size(), 14u);  // embedded NUL survives
}

TEST(OnnxExporter, Int4InitializersArePackedRawDataWithOnnxTypes) {
  TempDir dir;
  Graph g = make_mlp();
  g.set_opset("", 21);
  g.model.ir_version = 10;
  Tensor q(DType::I4, {3, 3});  // 9 values -> 5 bytes
  const uint8_t packed[5] = {0x21, 0x43, 0x65, 0x87, 0x0f};
  std::memcpy(q.mutable_bytes().data(), packed, 5);
  g.set_initializer("q", q);
  g.set_initializer("uq", iota_tensor(DType::U4, {7}));
  g.set_initializer("q_scale", f32_tensor({0.1f, 0.2f, 0.3f}, {3}));
  g.nodes.push_back(make_node("dq", "DequantizeLinear", {"q", "q_scale"}, {"dq_out"},
                              {Attribute::make_int("axis", 0)}));
  g.outputs.push_back(tensor_info("dq_out", DType::F32, {{.value = 3}, {.value = 3}}));
  export_onnx(g, dir / "int4.onnx");

  const onnx::ModelProto proto = read_proto(dir / "int4.onnx");
  const auto& inits = proto.graph().initializer();
  const auto find = [&](const std::string& name) {
    return *std::find_if(inits.begin(), inits.end(), [&](const auto& t) { return t.name() == name; });
  };
  EXPECT_EQ(find("q").data_type(), 22);
  EXPECT_EQ(find("q").raw_data(), std::string(reinterpret_cast<const char*>(packed), 5));
  EXPECT_EQ(find("uq").data_type(), 21);
  EXPECT_EQ(find("uq").raw_data().size(), 4u);

  const Graph back = import_onnx(dir / "int4.onnx");
  expect_graph_equal(g, back);
  EXPECT_EQ(back.find_initializer("q")->to_f32(),
            (std::vector<float>{1, 2, 3, 4, 5, 6, 7, -8, -1}));
}

TEST(OnnxExporter, InitializersKeepIrOrder) {
  TempDir dir;
  Graph g = make_mlp();
  g.set_initializer("zz_first_added_last", f32_tensor({1.0f}, {1}));
  g.set_initializer("aa", f32_tensor({2.0f}, {1}));
  export_onnx(g, dir / "order.onnx");
  const onnx::ModelProto proto = read_proto(dir / "order.onnx");
  std::vector<std::string> names;
  for (const auto& t : proto.graph().initializer()) names.push_back(t.name());
  EXPECT_EQ(names, (std::vector<std::string>{"w1", "b1", "w2", "b2", "zz_first_added_last", "aa"}));
}

TEST(OnnxExporter, ExternalDataRoundTripMapsLargeTensors) {
  TempDir dir;
  const Graph g = make_mlp(256);  // w1 4 KiB, w2 3 KiB, b1 1 KiB, b2 12 bytes
  OnnxExportOptions options;
  options.external_data = true;
  export_onnx(g, dir / "ext.onnx", options);
  EXPECT_EQ(list_dir(dir.path()), (std::vector<std::string>{"ext.onnx", "ext.onnx.data"}));

  const onnx::ModelProto proto = read_proto(dir / "ext.onnx");
  for (const auto& t : proto.graph().initializer()) {
    const bool external = t.data_location() == onnx::TensorProto::EXTERNAL;
    EXPECT_EQ(external, t.name() != "b2") << t.name();
    if (!external) continue;
    EXPECT_FALSE(t.has_raw_data()) << t.name();
    ASSERT_EQ(t.external_data_size(), 3) << t.name();
    EXPECT_EQ(t.external_data(0).value(), "ext.onnx.data");  // relative, never the temp name
    EXPECT_EQ(std::stoull(t.external_data(1).value()) % 64, 0u) << t.name();
  }

  const Graph back = import_onnx(dir / "ext.onnx");
  expect_graph_equal(g, back);
  for (const auto& [name, t] : back.initializers()) {
    EXPECT_EQ(t.is_mapped(), name != "b2") << name;
  }
  // The mapped tensors stay valid after the data file's name is gone (the map holds it).
  std::filesystem::remove(dir / "ext.onnx.data");
  EXPECT_TRUE(back.find_initializer("w1")->equals(*g.find_initializer("w1")));
}

TEST(OnnxExporter, ExternalDataTakesCustomNameAndThreshold) {
  TempDir dir;
  const Graph g = make_mlp(256);
  OnnxExportOptions options;
  options.external_data = true;
  options.external_data_name = "weights.bin";
  options.external_threshold = 4096;
  export_onnx(g, dir / "m.onnx", options);
  EXPECT_EQ(list_dir(dir.path()), (std::vector<std::string>{"m.onnx", "weights.bin"}));
  EXPECT_EQ(std::filesystem::file_size(dir / "weights.bin"), 4096u);  // only w1
  const Graph back = import_onnx(dir / "m.onnx");
  expect_graph_equal(g, back);
  EXPECT_TRUE(back.find_initializer("w1")->is_mapped());
  EXPECT_FALSE(back.find_initializer("w2")->is_mapped());
}

TEST(OnnxExporter, ExternalDataWithNothingLargeWritesNoDataFile) {
  TempDir dir;
  OnnxExportOptions options;
  options.external_data = true;
  export_onnx(make_mlp(), dir / "small.onnx", options);
  EXPECT_EQ(list_dir(dir.path()), (std::vector<std::string>{"small.onnx"}));
}

TEST(OnnxExporter, RejectsExternalDataNameThatIsNotAPlainFileName) {
  TempDir dir;
  for (const std::string name : {"../up.data", "sub/w.data", "m.onnx", ".."}) {
    OnnxExportOptions options;
    options.external_data = true;
    options.external_data_name = name;
    expect_error([&] { export_onnx(make_mlp(), dir / "m.onnx", options); }, ErrorCategory::Usage,
                 {name});
  }
  EXPECT_TRUE(list_dir(dir.path()).empty());
}

TEST(OnnxExporter, OutputIsDeterministic) {
  TempDir dir;
  const Graph g = make_all_attributes();
  export_onnx(g, dir / "a.onnx");
  export_onnx(g, dir / "b.onnx");
  EXPECT_EQ(read_bytes(dir / "a.onnx"), read_bytes(dir / "b.onnx"));

  OnnxExportOptions options;
  options.external_data = true;
  options.external_data_name = "shared.data";
  const Graph mlp = make_mlp(256);
  export_onnx(mlp, dir / "c.onnx", options);
  const std::string first_data = read_bytes(dir / "shared.data");
  export_onnx(mlp, dir / "d.onnx", options);
  EXPECT_EQ(read_bytes(dir / "c.onnx"), read_bytes(dir / "d.onnx"));
  EXPECT_EQ(first_data, read_bytes(dir / "shared.data"));
  // Re-exporting an imported model gives the same bytes again.
  export_onnx(import_onnx(dir / "a.onnx"), dir / "e.onnx");
  EXPECT_EQ(read_bytes(dir / "a.onnx"), read_bytes(dir / "e.onnx"));
}

// Large initializers go from their storage to the file, not through the protobuf message: the
// bytes equal one serialization of the whole message, whatever is streamed, with model and
// graph fields on both sides of the graph and of the initializers, subgraph initializers (never
// streamed), every dtype, an empty tensor, and external data beside.
TEST(OnnxExporter, StreamedInitializersGiveTheBytesOfOneSerialization) {
  TempDir dir;
  Graph dtypes = make_all_dtypes();
  dtypes.set_initializer("large", iota_tensor(DType::F32, {300, 7}));
  const std::vector<std::pair<std::string, Graph>> graphs = {
      {"dtypes", dtypes}, {"attrs", make_all_attributes()}, {"mlp", make_mlp(512)}};
  for (const auto& [name, g] : graphs) {
    for (const bool external : {false, true}) {
      OnnxExportOptions whole;
      whole.streamed_threshold = SIZE_MAX;
      whole.external_data = external;
      whole.external_threshold = 4096;
      whole.external_data_name = "same.data";  // the model names its data file
      const auto base = dir / (name + (external ? "_ext" : ""));
      export_onnx(g, base.string() + "_whole.onnx", whole);
      const std::string want = read_bytes(base.string() + "_whole.onnx");
      for (const size_t threshold : {size_t{0}, size_t{1}, size_t{64}, size_t{1} << 16}) {
        OnnxExportOptions streamed = whole;
        streamed.streamed_threshold = threshold;
        const auto path = base.string() + "_" + std::to_string(threshold) + ".onnx";
        export_onnx(g, path, streamed);
        EXPECT_EQ(read_bytes(path), want) << name << " external " << external << " threshold "
                                          << threshold;
      }
    }
    const Graph back = import_onnx(dir / (name + "_0.onnx"));
    expect_graph_equal(g, back);
  }
}

TEST(OnnxExporter, ReExportOverMappedSourceKeepsData) {
  TempDir dir;
  OnnxExportOptions options;
  options.external_data = true;
  const Graph g = make_mlp(256);
  export_onnx(g, dir / "m.onnx", options);
  const Graph back = import_onnx(dir / "m.onnx");
  export_onnx(back, dir / "m.onnx", options);  // overwrites the file `back` maps
  expect_graph_equal(g, import_onnx(dir / "m.onnx"));
}

TEST(OnnxExporter, CheckerFailureIsInvalidInputAndWritesNothing) {
  TempDir dir;
  Graph g = make_mlp();
  g.nodes[2].inputs.push_back("x");  // Relu takes one input
  const std::string msg = expect_error([&] { export_onnx(g, dir / "bad.onnx"); },
                                       ErrorCategory::InvalidInput, {"checker", "bad.onnx"});
  EXPECT_NE(msg.find("relu"), std::string::npos) << msg;
  EXPECT_TRUE(list_dir(dir.path()).empty());
  OnnxExportOptions options;
  options.run_checker = false;
  export_onnx(g, dir / "bad.onnx", options);
  EXPECT_EQ(list_dir(dir.path()), (std::vector<std::string>{"bad.onnx"}));
}

TEST(OnnxExporter, CheckerFailureWithExternalDataLeavesNoFiles) {
  TempDir dir;
  Graph g = make_mlp(256);
  g.nodes[2].inputs.push_back("x");
  OnnxExportOptions options;
  options.external_data = true;
  expect_error([&] { export_onnx(g, dir / "bad.onnx", options); }, ErrorCategory::InvalidInput,
               {"checker"});
  EXPECT_TRUE(list_dir(dir.path()).empty());
}

TEST(OnnxExporter, SkipsCheckerForOpsetsNewerThanItKnows) {
  TempDir dir;
  Graph g = make_mlp();
  g.set_opset("", 21);
  g.model.ir_version = 10;
  g.nodes[2].inputs.push_back("x");  // the old checker would reject this; it must not run
  export_onnx(g, dir / "new.onnx");
  EXPECT_EQ(read_proto(dir / "new.onnx").opset_import(0).version(), 21);
}

TEST(OnnxExporter, RunsGraphCheckBeforeWriting) {
  TempDir dir;
  Graph g = make_mlp();
  g.nodes[1].inputs[0] = "nowhere";
  OnnxExportOptions options;
  options.run_checker = false;
  expect_error([&] { export_onnx(g, dir / "m.onnx", options); }, ErrorCategory::InvalidInput,
               {"'nowhere'", "Add 'add'", "m.onnx"});
  EXPECT_TRUE(list_dir(dir.path()).empty());
}

TEST(OnnxExporter, MissingOutputFolderIsIOError) {
  TempDir dir;
  expect_error([&] { export_onnx(make_mlp(), dir / "no" / "such" / "m.onnx"); }, ErrorCategory::IO,
               {"does not exist", "such"});
}

TEST(OnnxExporter, InitializerWithoutStorageIsInternalError) {
  TempDir dir;
  Graph g = make_mlp();
  g.set_initializer("hollow", Tensor());
  expect_error([&] { export_onnx(g, dir / "m.onnx"); }, ErrorCategory::Internal, {"'hollow'"});
  EXPECT_TRUE(list_dir(dir.path()).empty());
}

TEST(OnnxExporter, LargeModelsGoExternalWithoutBeingAsked) {
  TempDir dir;
  const Graph g = make_mlp(256);  // 8 KiB of tensors
  OnnxExportOptions options;
  options.auto_external_bytes = 8 * 1024;
  export_onnx(g, dir / "big.onnx", options);
  EXPECT_EQ(list_dir(dir.path()), (std::vector<std::string>{"big.onnx", "big.onnx.data"}));
  const Graph back = import_onnx(dir / "big.onnx");
  expect_graph_equal(g, back);
  EXPECT_TRUE(back.find_initializer("w1")->is_mapped());

  options.auto_external_bytes = 64 * 1024;  // now it fits inline
  export_onnx(g, dir / "fits.onnx", options);
  EXPECT_FALSE(std::filesystem::exists(dir / "fits.onnx.data"));
}
