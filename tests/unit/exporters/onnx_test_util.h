#pragma once
// Shared by the ONNX importer and exporter tests: a temporary folder, sample graphs, file
// helpers and an assertion on the category and message of a qforge::Error.
#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <iterator>
#include <numeric>
#include <string>
#include <vector>

#include "ir/error.h"
#include "ir/graph.h"

namespace qforge::testing {

class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    path_ = std::filesystem::temp_directory_path() /
            (std::string("qforge-test-") + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

inline std::vector<std::string> list_dir(const std::filesystem::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    names.push_back(e.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

inline std::string read_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

inline void write_bytes(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

inline void write_proto(const onnx::ModelProto& model, const std::filesystem::path& path) {
  write_bytes(path, model.SerializeAsString());
}

inline onnx::ModelProto read_proto(const std::filesystem::path& path) {
  onnx::ModelProto model;
  EXPECT_TRUE(model.ParseFromString(read_bytes(path))) << path;
  return model;
}

// Runs `fn`, expects an Error of `category` whose message contains every one of `parts`;
// returns the message.
inline std::string expect_error(const std::function<void()>& fn, ErrorCategory category,
                                std::initializer_list<std::string> parts) {
  try {
    fn();
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(category_name(e.category()), category_name(category)) << msg;
    for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "message is not one line: " << msg;
    return msg;
  }
  ADD_FAILURE() << "no qforge::Error thrown";
  return "";
}

inline Tensor iota_tensor(DType dtype, Shape shape, float start = 0.0f) {
  Tensor t(dtype, std::move(shape));
  auto bytes = t.mutable_bytes();
  for (size_t i = 0; i < bytes.size(); ++i) {
    bytes[i] = static_cast<std::byte>((static_cast<size_t>(start) * 7 + i * 13 + 1) & 0xff);
  }
  return t;
}

inline Tensor f32_tensor(std::vector<float> values, Shape shape) {
  return Tensor::from_f32(values, std::move(shape));
}

inline ValueInfo tensor_info(std::string name, DType dtype, std::vector<Dim> dims) {
  return {.name = std::move(name), .dtype = dtype, .shape = std::move(dims)};
}

inline Node make_node(std::string name, std::string op, std::vector<std::string> in,
                      std::vector<std::string> out, std::vector<Attribute> attrs = {}) {
  Node n;
  n.name = std::move(name);
  n.op_type = std::move(op);
  n.inputs = std::move(in);
  n.outputs = std::move(out);
  n.attributes = std::move(attrs);
  return n;
}

// x[batch, 4] -> MatMul(w1) -> Add(b1) -> Relu -> Gemm(w2, b2) -> y[batch, 3], opset 17, with
// model properties, metadata and value_info filled in.
inline Graph make_mlp(int64_t hidden = 8) {
  Graph g;
  g.name = "mlp";
  g.doc_string = "a small MLP";
  g.model.ir_version = 8;
  g.model.producer_name = "qforge-test";
  g.model.producer_version = "1.0";
  g.model.domain = "ai.qforge.test";
  g.model.model_version = 3;
  g.model.doc_string = "model doc";
  g.set_opset("", 17);
  g.metadata = {{"source", "unit test"}, {"author", "qforge"}};
  g.inputs.push_back(tensor_info("x", DType::F32, {{.param = "batch"}, {.value = 4}}));
  g.inputs.back().doc_string = "the input";
  g.outputs.push_back(tensor_info("y", DType::F32, {{.param = "batch"}, {.value = 3}}));
  g.value_info.push_back(tensor_info("h", DType::F32, {{}, {.value = hidden}}));
  std::vector<float> w1(static_cast<size_t>(4 * hidden)), b1(static_cast<size_t>(hidden));
  std::vector<float> w2(static_cast<size_t>(3 * hidden)), b2(3);
  for (size_t i = 0; i < w1.size(); ++i) w1[i] = 0.01f * static_cast<float>(i) - 0.1f;
  for (size_t i = 0; i < b1.size(); ++i) b1[i] = 0.5f - 0.1f * static_cast<float>(i);
  for (size_t i = 0; i < w2.size(); ++i) w2[i] = 0.02f * static_cast<float>(i % 7) - 0.05f;
  std::iota(b2.begin(), b2.end(), 1.0f);
  g.set_initializer("w1", f32_tensor(w1, {4, hidden}));
  g.set_initializer("b1", f32_tensor(b1, {hidden}));
  g.set_initializer("w2", f32_tensor(w2, {3, hidden}));
  g.set_initializer("b2", f32_tensor(b2, {3}));
  g.nodes.push_back(make_node("mm", "MatMul", {"x", "w1"}, {"h0"}));
  g.nodes.back().doc_string = "first layer";
  g.nodes.push_back(make_node("add", "Add", {"h0", "b1"}, {"h"}));
  g.nodes.push_back(make_node("relu", "Relu", {"h"}, {"r"}));
  g.nodes.push_back(make_node("gemm", "Gemm", {"r", "w2", "b2"}, {"y"},
                              {Attribute::make_int("transB", 1), Attribute::make_float("alpha", 1.0f)}));
  return g;
}

}  // namespace qforge::testing
