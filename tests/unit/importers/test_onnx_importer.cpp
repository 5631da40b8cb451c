#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "exporters/onnx/onnx_exporter.h"
#include "importers/onnx/onnx_importer.h"
#include "ir/half.h"
#include "tests/unit/exporters/graph_compare.h"
#include "tests/unit/exporters/onnx_test_util.h"

using namespace qforge;
using namespace qforge::testing;

namespace {

// A model whose graph holds `init` as its only initializer and output.
onnx::ModelProto model_with(const onnx::TensorProto& init) {
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(17);
  auto& g = *m.mutable_graph();
  g.set_name("g");
  *g.add_initializer() = init;
  g.add_output()->set_name(init.name());
  return m;
}

onnx::TensorProto tensor_proto(const std::string& name, int data_type, std::vector<int64_t> dims) {
  onnx::TensorProto t;
  t.set_name(name);
  t.set_data_type(data_type);
  for (int64_t d : dims) t.add_dims(d);
  return t;
}

onnx::TensorProto external_tensor(const std::string& name, const std::string& location,
                                  int64_t numel, const std::string& offset = "0") {
  onnx::TensorProto t = tensor_proto(name, 1, {numel});
  t.set_data_location(onnx::TensorProto::EXTERNAL);
  auto* e = t.add_external_data();
  e->set_key("location");
  e->set_value(location);
  e = t.add_external_data();
  e->set_key("offset");
  e->set_value(offset);
  e = t.add_external_data();
  e->set_key("length");
  e->set_value(std::to_string(numel * 4));
  return t;
}

Tensor import_single(const TempDir& dir, const onnx::TensorProto& init) {
  write_proto(model_with(init), dir / "m.onnx");
  const Graph g = import_onnx(dir / "m.onnx");
  EXPECT_EQ(g.initializers().size(), 1u);
  return g.initializers().at(0).second;
}

template <typename T>
std::vector<T> values_of(const Tensor& t) {
  const auto d = t.data<T>();
  return {d.begin(), d.end()};
}

}  // namespace

TEST(OnnxImporter, ReadsTypedDataFieldsOfEveryDtype) {
  TempDir dir;
  auto f32 = tensor_proto("f32", 1, {3});
  for (float v : {1.5f, -2.0f, 0.25f}) f32.add_float_data(v);
  EXPECT_EQ(values_of<float>(import_single(dir, f32)), (std::vector<float>{1.5f, -2.0f, 0.25f}));

  auto f64 = tensor_proto("f64", 11, {2});
  for (double v : {1e300, -3.0}) f64.add_double_data(v);
  EXPECT_EQ(values_of<double>(import_single(dir, f64)), (std::vector<double>{1e300, -3.0}));

  auto i64 = tensor_proto("i64", 7, {2});
  for (int64_t v : {int64_t{1} << 50, int64_t{-7}}) i64.add_int64_data(v);
  EXPECT_EQ(values_of<int64_t>(import_single(dir, i64)),
            (std::vector<int64_t>{int64_t{1} << 50, -7}));

  auto i32 = tensor_proto("i32", 6, {2});
  for (int v : {-100000, 7}) i32.add_int32_data(v);
  EXPECT_EQ(values_of<int32_t>(import_single(dir, i32)), (std::vector<int32_t>{-100000, 7}));

  auto i16 = tensor_proto("i16", 5, {2});
  for (int v : {-300, 300}) i16.add_int32_data(v);
  EXPECT_EQ(values_of<int16_t>(import_single(dir, i16)), (std::vector<int16_t>{-300, 300}));

  auto i8 = tensor_proto("i8", 3, {3});
  for (int v : {-128, 0, 127}) i8.add_int32_data(v);
  EXPECT_EQ(values_of<int8_t>(import_single(dir, i8)), (std::vector<int8_t>{-128, 0, 127}));

  auto u8 = tensor_proto("u8", 2, {2});
  for (int v : {255, 1}) u8.add_int32_data(v);
  EXPECT_EQ(values_of<uint8_t>(import_single(dir, u8)), (std::vector<uint8_t>{255, 1}));

  auto b = tensor_proto("bool", 9, {3});
  for (int v : {1, 0, 5}) b.add_int32_data(v);
  EXPECT_EQ(values_of<uint8_t>(import_single(dir, b)), (std::vector<uint8_t>{1, 0, 1}));

  auto f16 = tensor_proto("f16", 10, {2});
  f16.add_int32_data(f32_to_f16(1.5f));
  f16.add_int32_data(f32_to_f16(-0.5f));
  EXPECT_EQ(import_single(dir, f16).to_f32(), (std::vector<float>{1.5f, -0.5f}));

  auto bf16 = tensor_proto("bf16", 16, {2});
  bf16.add_int32_data(f32_to_bf16(3.0f));
  bf16.add_int32_data(f32_to_bf16(-8.0f));
  EXPECT_EQ(import_single(dir, bf16).to_f32(), (std::vector<float>{3.0f, -8.0f}));

  auto i4 = tensor_proto("i4", 22, {3});  // int32_data holds one packed byte each
  i4.add_int32_data(0xF7);                // 7, -1
  i4.add_int32_data(0x08);                // -8
  EXPECT_EQ(import_single(dir, i4).to_f32(), (std::vector<float>{7, -1, -8}));

  auto u4 = tensor_proto("u4", 21, {2});
  u4.add_int32_data(0xF3);
  EXPECT_EQ(import_single(dir, u4).to_f32(), (std::vector<float>{3, 15}));
}

TEST(OnnxImporter, RejectsTypedFieldCountThatContradictsShape) {
  TempDir dir;
  auto t = tensor_proto("w", 1, {4});
  t.add_float_data(1.0f);
  expect_error([&] { import_single(dir, t); }, ErrorCategory::InvalidInput,
               {"tensor 'w'", "m.onnx", "float_data", "[4]"});
}

TEST(OnnxImporter, RejectsValuesInTheWrongTypedField) {
  TempDir dir;
  auto t = tensor_proto("w", 1, {1});
  t.add_int64_data(1);
  expect_error([&] { import_single(dir, t); }, ErrorCategory::InvalidInput, {"tensor 'w'", "f32"});
}

TEST(OnnxImporter, RejectsRawDataOfWrongSize) {
  TempDir dir;
  auto t = tensor_proto("w", 1, {2, 2});
  t.set_raw_data(std::string(15, '\0'));
  expect_error([&] { import_single(dir, t); }, ErrorCategory::InvalidInput,
               {"tensor 'w'", "15 bytes", "16"});
}

TEST(OnnxImporter, UnknownDataTypeIsInvalidInputNamingTensor) {
  TempDir dir;
  auto t = tensor_proto("w", 99, {1});
  t.set_raw_data("abcd");
  expect_error([&] { import_single(dir, t); }, ErrorCategory::InvalidInput,
               {"unknown dtype 99 in tensor 'w'", "m.onnx"});
}

TEST(OnnxImporter, DtypesTheIrLacksAreUnsupported) {
  TempDir dir;
  auto s = tensor_proto("names", 8, {1});
  s.add_string_data("hello");
  expect_error([&] { import_single(dir, s); }, ErrorCategory::Unsupported, {"'names'", "string"});
  auto u16 = tensor_proto("w16", 4, {1});
  u16.set_raw_data("ab");
  expect_error([&] { import_single(dir, u16); }, ErrorCategory::Unsupported, {"'w16'", "uint16"});
  auto f8 = tensor_proto("w8", 17, {1});
  f8.set_raw_data("a");
  expect_error([&] { import_single(dir, f8); }, ErrorCategory::Unsupported,
               {"'w8'", "float8e4m3fn"});
}

TEST(OnnxImporter, RandomBytesAreNotAnOnnxModel) {
  TempDir dir;
  std::mt19937 rng(1234);
  const std::string quoted = std::string("'") + (dir / "random.onnx").string() + "'";
  for (int trial = 0; trial < 20; ++trial) {
    std::string bytes(64 + trial * 37, '\0');
    for (char& c : bytes) c = static_cast<char>(rng());
    write_bytes(dir / "random.onnx", bytes);
    expect_error([&] { import_onnx(dir / "random.onnx"); }, ErrorCategory::InvalidInput,
                 {quoted, "not a valid ONNX model"});
  }
}

TEST(OnnxImporter, TruncatedModelIsInvalidInput) {
  TempDir dir;
  export_onnx(make_mlp(64), dir / "full.onnx");
  const std::string bytes = read_bytes(dir / "full.onnx");
  for (size_t cut : {bytes.size() / 2, bytes.size() - 1, size_t{10}}) {
    write_bytes(dir / "cut.onnx", bytes.substr(0, cut));
    expect_error([&] { import_onnx(dir / "cut.onnx"); }, ErrorCategory::InvalidInput,
                 {"cut.onnx", "not a valid ONNX model"});
  }
}

TEST(OnnxImporter, MissingFileIsIOError) {
  TempDir dir;
  expect_error([&] { import_onnx(dir / "absent.onnx"); }, ErrorCategory::IO, {"absent.onnx"});
}

TEST(OnnxImporter, MissingExternalDataFileIsIOErrorNamingTensorAndFile) {
  TempDir dir;
  write_proto(model_with(external_tensor("w", "weights.bin", 4)), dir / "m.onnx");
  expect_error([&] { import_onnx(dir / "m.onnx"); }, ErrorCategory::IO,
               {"tensor 'w'", "weights.bin", "m.onnx"});
}

TEST(OnnxImporter, ExternalLocationLeavingTheFolderIsRejected) {
  TempDir dir;
  std::filesystem::create_directories(dir / "model");
  write_bytes(dir / "outside.bin", std::string(16, 'x'));
  for (const std::string& location :
       std::vector<std::string>{"../outside.bin", "sub/../../outside.bin", (dir / "outside.bin").string()}) {
    write_proto(model_with(external_tensor("w", location, 4)), dir / "model" / "m.onnx");
    expect_error([&] { import_onnx(dir / "model" / "m.onnx"); }, ErrorCategory::InvalidInput,
                 {"tensor 'w'", location});
  }
}

TEST(OnnxImporter, ExternalSymlinkLeadingOutIsRejected) {
  TempDir dir;
  std::filesystem::create_directories(dir / "model");
  write_bytes(dir / "secret.bin", std::string(16, 'x'));
  std::filesystem::create_symlink(dir / "secret.bin", dir / "model" / "link.bin");
  write_proto(model_with(external_tensor("w", "link.bin", 4)), dir / "model" / "m.onnx");
  expect_error([&] { import_onnx(dir / "model" / "m.onnx"); }, ErrorCategory::InvalidInput,
               {"tensor 'w'", "link.bin", "outside the model's folder"});
  // A link that stays inside the folder is fine.
  std::filesystem::rename(dir / "secret.bin", dir / "model" / "real.bin");
  std::filesystem::remove(dir / "model" / "link.bin");
  std::filesystem::create_symlink("real.bin", dir / "model" / "link.bin");
  EXPECT_EQ(import_onnx(dir / "model" / "m.onnx").find_initializer("w")->numel(), 4u);
}

TEST(OnnxImporter, ExternalRangeBeyondFileIsRejected) {
  TempDir dir;
  write_bytes(dir / "w.bin", std::string(20, 'x'));
  write_proto(model_with(external_tensor("w", "w.bin", 4, "8")), dir / "m.onnx");
  expect_error([&] { import_onnx(dir / "m.onnx"); }, ErrorCategory::InvalidInput,
               {"tensor 'w'", "w.bin", "offset 8", "length 16", "20 bytes"});
  // An offset that would overflow offset + length.
  write_proto(model_with(external_tensor("w", "w.bin", 4, "18446744073709551615")), dir / "m.onnx");
  expect_error([&] { import_onnx(dir / "m.onnx"); }, ErrorCategory::InvalidInput,
               {"tensor 'w'", "runs past the end"});
}

TEST(OnnxImporter, ExternalLengthMustMatchShape) {
  TempDir dir;
  write_bytes(dir / "w.bin", std::string(64, 'x'));
  auto t = external_tensor("w", "w.bin", 4);
  t.mutable_external_data(2)->set_value("12");
  write_proto(model_with(t), dir / "m.onnx");
  expect_error([&] { import_onnx(dir / "m.onnx"); }, ErrorCategory::InvalidInput,
               {"tensor 'w'", "length 12", "16 bytes"});
  t.mutable_external_data(1)->set_value("-4");
  t.mutable_external_data(2)->set_value("16");
  write_proto(model_with(t), dir / "m.onnx");
  expect_error([&] { import_onnx(dir / "m.onnx"); }, ErrorCategory::InvalidInput,
               {"tensor 'w'", "offset '-4'"});
}

TEST(OnnxImporter, ExternalTensorsAreWindowsOfOneMapping) {
  TempDir dir;
  std::string data(64, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i);
  write_bytes(dir / "w.bin", data);
  auto m = model_with(external_tensor("a", "w.bin", 4, "0"));
  *m.mutable_graph()->add_initializer() = external_tensor("b", "./w.bin", 2, "32");
  m.mutable_graph()->add_output()->set_name("b");
  write_proto(m, dir / "m.onnx");
  const Graph g = import_onnx(dir / "m.onnx");
  const Tensor& a = *g.find_initializer("a");
  const Tensor& b = *g.find_initializer("b");
  ASSERT_TRUE(a.is_mapped() && b.is_mapped());
  EXPECT_EQ(a.storage(), b.storage());
  EXPECT_EQ(b.offset(), 32u);
  EXPECT_EQ(std::memcmp(b.bytes().data(), data.data() + 32, 8), 0);
}

TEST(OnnxImporter, LocalFunctionsAndSparseInitializersAreUnsupported) {
  TempDir dir;
  auto w = tensor_proto("w", 1, {1});
  w.add_float_data(1.0f);
  auto m = model_with(w);
  m.add_functions()->set_name("my_fn");
  write_proto(m, dir / "f.onnx");
  expect_error([&] { import_onnx(dir / "f.onnx"); }, ErrorCategory::Unsupported,
               {"f.onnx", "local functions", "my_fn"});

  auto s = model_with(w);
  auto* sparse = s.mutable_graph()->add_sparse_initializer();
  *sparse->mutable_values() = tensor_proto("sp", 1, {1});
  write_proto(s, dir / "s.onnx");
  expect_error([&] { import_onnx(dir / "s.onnx"); }, ErrorCategory::Unsupported,
               {"s.onnx", "sparse", "'sp'"});
}

TEST(OnnxImporter, NonTensorGraphInputIsUnsupported) {
  TempDir dir;
  auto w = tensor_proto("w", 1, {1});
  w.add_float_data(1.0f);
  auto m = model_with(w);
  auto* in = m.mutable_graph()->add_input();
  in->set_name("seq");
  in->mutable_type()->mutable_sequence_type()->mutable_elem_type()->mutable_tensor_type()->set_elem_type(1);
  write_proto(m, dir / "m.onnx");
  expect_error([&] { import_onnx(dir / "m.onnx"); }, ErrorCategory::Unsupported,
               {"input 'seq'", "sequence"});
}

TEST(OnnxImporter, ModelWithoutGraphIsInvalid) {
  TempDir dir;
  onnx::ModelProto m;
  m.set_ir_version(8);
  write_proto(m, dir / "m.onnx");
  expect_error([&] { import_onnx(dir / "m.onnx"); }, ErrorCategory::InvalidInput,
               {"m.onnx", "not a valid ONNX model", "no graph"});
}

TEST(OnnxImporter, RunsGraphCheckNamingFileAndNode) {
  TempDir dir;
  auto w = tensor_proto("w", 1, {1});
  w.add_float_data(1.0f);
  auto m = model_with(w);
  auto* n = m.mutable_graph()->add_node();
  n->set_name("r");
  n->set_op_type("Relu");
  n->add_input("ghost");
  n->add_output("y");
  write_proto(m, dir / "m.onnx");
  expect_error([&] { import_onnx(dir / "m.onnx"); }, ErrorCategory::InvalidInput,
               {"m.onnx", "Relu 'r'", "'ghost'"});
}

TEST(OnnxImporter, AttributeWithoutTypeIsInferred) {
  TempDir dir;
  auto w = tensor_proto("w", 1, {1});
  w.add_float_data(1.0f);
  auto m = model_with(w);
  auto* n = m.mutable_graph()->add_node();
  n->set_op_type("Identity");
  n->add_input("w");
  n->add_output("y");
  auto* a = n->add_attribute();
  a->set_name("legacy");
  a->add_ints(3);
  write_proto(m, dir / "m.onnx");
  const Graph g = import_onnx(dir / "m.onnx");
  ASSERT_NE(g.nodes[0].attr("legacy"), nullptr);
  EXPECT_EQ(static_cast<int>(g.nodes[0].attr("legacy")->type), static_cast<int>(AttrType::Ints));
  EXPECT_EQ(g.nodes[0].attr("legacy")->ints, std::vector<int64_t>{3});
}

TEST(OnnxImporter, ImportFromBytesCopiesEmbeddedTensors) {
  TempDir dir;
  export_onnx(make_mlp(), dir / "m.onnx");
  std::string bytes = read_bytes(dir / "m.onnx");
  const Graph g = import_onnx_bytes(std::as_bytes(std::span(bytes.data(), bytes.size())),
                                    dir.path(), "in-memory");
  std::fill(bytes.begin(), bytes.end(), '\0');
  expect_graph_equal(make_mlp(), g);
  EXPECT_FALSE(g.find_initializer("w1")->is_mapped());
  expect_error([&] { import_onnx_bytes({}, dir.path(), "empty-buffer"); },
               ErrorCategory::InvalidInput, {"'empty-buffer'", "not a valid ONNX model"});
}

// Importing a file drops each initializer's pages of the mapped file once its data is copied,
// the first and last page shared with its neighbours too (ir/page_release.h): every tensor
// still has its own bytes, the ones an import from memory gives. Initializers of odd sizes
// (3 to 5,000 floats, some straddling pages, some inside one) one after another, and the file
// itself is left as it was.
TEST(OnnxImporter, FileImportReleasesCopiedPagesAndKeepsEveryValue) {
  TempDir dir;
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(17);
  auto& graph = *m.mutable_graph();
  graph.set_name("g");
  std::mt19937 rng(77);
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  const int64_t sizes[] = {3, 5000, 1021, 7, 2049, 1, 4096, 333, 1500, 999, 5, 3000};
  for (size_t i = 0; i < std::size(sizes); ++i) {
    std::string name = "t";
    name += std::to_string(i);
    auto t = tensor_proto(name, 1, {sizes[i]});
    std::vector<float> v(static_cast<size_t>(sizes[i]));
    for (float& f : v) f = value(rng);
    t.set_raw_data(std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4));
    *graph.add_initializer() = t;
    graph.add_output()->set_name(t.name());
  }
  write_proto(m, dir / "m.onnx");
  const std::string before = read_bytes(dir / "m.onnx");
  const Graph from_file = import_onnx(dir / "m.onnx");
  const Graph from_memory = import_onnx_bytes(
      std::as_bytes(std::span(before.data(), before.size())), dir.path(), "in-memory");
  ASSERT_EQ(from_file.initializers().size(), std::size(sizes));
  for (const auto& [name, t] : from_memory.initializers()) {
    const Tensor* f = from_file.find_initializer(name);
    ASSERT_NE(f, nullptr) << name;
    ASSERT_EQ(f->nbytes(), t.nbytes()) << name;
    EXPECT_EQ(std::memcmp(f->bytes().data(), t.bytes().data(), t.nbytes()), 0) << name;
  }
  EXPECT_EQ(read_bytes(dir / "m.onnx"), before);
}
