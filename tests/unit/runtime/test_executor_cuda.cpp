// Executor on Device::Cuda (runtime/cuda/device_runtime.h) against the same graph on CPU: the
// sample CNN (Gemm on cuBLAS, the rest on CPU with copies) and a W4A16 graph (the int4 product
// on the device). Without a device: the clear error, and these comparisons skip.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "importers/onnx/onnx_importer.h"
#include "ir/half.h"
#include "kernels/device.h"
#include "kernels/int4.h"
#include "runtime/executor.h"
#include "runtime_test_util.h"

using namespace qforge;
using namespace qforge::rt_test;

namespace {

std::vector<float> run_on(const Graph& g, const std::vector<std::pair<std::string, Tensor>>& feeds,
                          Device device) {
  Executor ex(g, {.device = device, .threads = 2});
  return ex.run(feeds).at(0).to_f32();
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want, float rel) {
  ASSERT_EQ(got.size(), want.size());
  float scale = 0.0f;
  for (float v : want) scale = std::max(scale, std::fabs(v));
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], rel * scale + 1e-6f) << "element " << i;
  }
}

}  // namespace

TEST(ExecutorCuda, WithoutADeviceTheErrorSaysWhy) {
  if (cuda_available()) GTEST_SKIP() << "a CUDA device is present: the no-device error is not run";
  const Graph g = one_node_graph({.op = "Relu", .inputs = {f32({2}, {1, -1})}});
  const auto e = catch_error([&] { Executor ex(g, {.device = Device::Cuda}); });
  EXPECT_EQ(e.category, ErrorCategory::Unsupported);
  EXPECT_NE(e.message.find(cuda_built() ? "no CUDA device: " : "CUDA not built in"),
            std::string::npos)
      << e.message;
}

TEST(ExecutorCuda, SampleCnnMatchesCpu) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device: the sample CNN on CUDA is not compared";
  const Graph g = import_onnx(std::string(QFORGE_SOURCE_DIR) + "/calib_data/sample_cnn.onnx");
  ASSERT_FALSE(g.inputs.empty());
  Shape shape;
  for (const Dim& d : *g.inputs[0].shape) shape.push_back(d.value ? *d.value : 4);
  const std::vector<std::pair<std::string, Tensor>> feeds = {
      {g.inputs[0].name, random_f32(shape, 3)}};
  expect_close(run_on(g, feeds, Device::Cuda), run_on(g, feeds, Device::Cpu), 1e-5f);
}

TEST(ExecutorCuda, W4A16GraphMatchesCpu) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device: the W4A16 graph on CUDA is not compared";
  const int64_t m = 16, k = 100, n = 70, block = 32, blocks = int4_block_count(k, block);
  std::vector<int8_t> q(static_cast<size_t>(k * n));
  for (size_t i = 0; i < q.size(); ++i) q[i] = static_cast<int8_t>(static_cast<int>(i * 7 % 16) - 8);
  Tensor wq(DType::I4, {k, n});
  pack_int4(q, wq.mutable_data<uint8_t>());
  std::vector<float> s(static_cast<size_t>(blocks * n));
  for (size_t i = 0; i < s.size(); ++i) s[i] = 0.01f * static_cast<float>(1 + i % 9);
  Graph g;
  g.set_opset("", 21);
  g.inputs.push_back({.name = "x", .dtype = DType::F32});
  g.set_initializer("wq", wq);
  g.set_initializer("ws", Tensor::from_f32(s, {blocks, n}, DType::F16));
  Node dq;
  dq.op_type = "DequantizeLinear";
  dq.inputs = {"wq", "ws"};
  dq.outputs = {"w16"};
  dq.set_attr(attr_int("axis", 0));
  dq.set_attr(attr_int("block_size", block));
  Node cast;
  cast.op_type = "Cast";
  cast.inputs = {"w16"};
  cast.outputs = {"w"};
  cast.set_attr(attr_int("to", dtype_to_onnx(DType::F32)));
  Node mm;
  mm.op_type = "MatMul";
  mm.inputs = {"x", "w"};
  mm.outputs = {"h"};
  Node relu;  // a CPU op after the device product: the value comes back
  relu.op_type = "Relu";
  relu.inputs = {"h"};
  relu.outputs = {"y"};
  g.nodes = {dq, cast, mm, relu};
  g.outputs.push_back({.name = "y"});
  const std::vector<std::pair<std::string, Tensor>> feeds = {{"x", random_f32({m, k}, 5)}};
  expect_close(run_on(g, feeds, Device::Cuda), run_on(g, feeds, Device::Cpu), 1e-5f);
}
