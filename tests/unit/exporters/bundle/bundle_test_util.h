#pragma once
// Shared by the bundle writer and reader tests: a small QDQ graph (an int8 per-channel weight,
// an int4 per-tensor bias, a float initializer) and a bundle written from it.
// The graph is built by hand, as if quantized elsewhere: describe_quantized() gives it the
// quantized-tensor records the ONNX importer would.
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "exporters/bundle/bundle_writer.h"
#include "importers/onnx/onnx_quant_records.h"
#include "tests/unit/exporters/onnx_test_util.h"

namespace qforge::testing {

// Records for the QDQ nodes of a graph built by hand (a record of the same name is replaced).
inline void describe_quantized(Graph& g) {
  for (QuantRecord& r : onnx_quant_records(g)) g.add_quant_record(std::move(r));
}

// z = (x @ DQ(W, ws, wz, axis=1) + DQ(B, bs)) * c, x: [batch, 4] f32, z: [batch, 3].
inline Graph qdq_graph(bool with_records = true) {
  Graph g;
  g.name = "qdq";
  g.set_opset("", 21);
  g.model.ir_version = 10;
  g.inputs = {tensor_info("x", DType::F32, {Dim{.param = "batch"}, Dim{.value = 4}})};
  g.outputs = {tensor_info("z", DType::F32, {Dim{.param = "batch"}, Dim{.value = 3}})};
  Tensor w(DType::I8, {4, 3});
  auto wd = w.mutable_data<int8_t>();
  for (size_t i = 0; i < wd.size(); ++i) wd[i] = static_cast<int8_t>(static_cast<int>(i) * 11 - 60);
  g.set_initializer("W", w);
  g.set_initializer("ws", f32_tensor({0.01f, 0.02f, 0.03f}, {3}));
  Tensor wz(DType::I8, {3});
  g.set_initializer("wz", wz);
  Tensor b(DType::I4, {3});
  b.mutable_bytes()[0] = std::byte{0x21};  // values 1, 2 (low nibble first)
  b.mutable_bytes()[1] = std::byte{0x0d};  // value -3
  g.set_initializer("B", b);
  g.set_initializer("bs", f32_tensor({0.5f}, {}));
  g.set_initializer("c", f32_tensor({1.0f, 2.0f, 3.0f}, {3}));
  g.nodes.push_back(make_node("dq_w", "DequantizeLinear", {"W", "ws", "wz"}, {"Wf"},
                              {Attribute::make_int("axis", 1)}));
  g.nodes.push_back(make_node("dq_b", "DequantizeLinear", {"B", "bs"}, {"Bf"}));
  g.nodes.push_back(make_node("mm", "MatMul", {"x", "Wf"}, {"m"}));
  g.nodes.push_back(make_node("add", "Add", {"m", "Bf"}, {"y"}));
  g.nodes.push_back(make_node("mul", "Mul", {"y", "c"}, {"z"}));
  if (with_records) describe_quantized(g);
  return g;
}

inline CalibrationTable sample_table() {
  CalibrationTable t;
  t.method = "entropy";
  t.dataset_digest = std::string(64, 'a');
  t.samples = 8;
  t.ranges["x"] = {2.0f, -1.5f, 2.0f};
  t.ranges["onnx::MatMul_7"] = {4.0f, 0.0f, 4.0f};
  return t;
}

// A source file to digest and a BundleInfo naming it.
inline BundleInfo sample_info(const TempDir& tmp) {
  const auto source = tmp / "source.onnx";
  write_bytes(source, "source model bytes");
  BundleInfo info;
  info.source_path = source;
  info.scheme = "int8-weights";
  info.calibration = sample_table();
  info.accuracy = {{"top1", 0.91}, {"top1_float", 0.92}};
  info.report = {{"layers", nlohmann::json::array({{{"name", "mm"}, {"sqnr_db", 31.5}}})}};
  return info;
}

inline nlohmann::json read_json(const std::filesystem::path& path) {
  return nlohmann::json::parse(read_bytes(path));
}

inline void write_json(const std::filesystem::path& path, const nlohmann::json& j) {
  write_bytes(path, j.dump(2));
}

}  // namespace qforge::testing
