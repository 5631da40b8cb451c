// Executor on Device::Cuda (runtime/cuda/device_runtime.h) against the same graph on CPU: the
// sample CNN (Gemm on cuBLAS, the rest on CPU with copies), W4A16 graphs (the int4 product on the
// device, f32 and fp16 activations), and the Int4MatMul op's edge cases on both devices. Each
// CUDA comparison also checks that the device ran ops (RunCounts), so a silent fallback of every
// node to the CPU cannot pass. Without a device: the clear error, and the comparisons skip (or
// fail, under QFORGE_REQUIRE_CUDA=1; tests/unit/cuda_test.h).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "importers/onnx/onnx_importer.h"
#include "ir/half.h"
#include "kernels/device.h"
#include "kernels/int4.h"
#include "runtime/executor.h"
#include "runtime/ops/matmul_nbits.h"
#include "runtime_test_util.h"
#include "tests/unit/cuda_test.h"

using namespace qforge;
using namespace qforge::rt_test;

namespace {

using Feeds = std::vector<std::pair<std::string, Tensor>>;

Tensor run_on(const Graph& g, const Feeds& feeds, Device device, RunCounts* counts = nullptr,
              HalfCompute half = HalfCompute::Auto) {
  Executor ex(g, {.device = device, .threads = 2, .half_compute = half});
  return ex.run(feeds, counts).at(0);
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want, float rel) {
  ASSERT_EQ(got.size(), want.size());
  float scale = 0.0f;
  for (float v : want) scale = std::max(scale, std::fabs(v));
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], rel * scale + 1e-6f) << "element " << i;
  }
}

// x [m, k] (dtype of x) . DequantizeLinear(int4 [k, n], fp16 scales, block) [-> Cast f32] -> y;
// the executor fuses it into one Int4MatMul. With f32 activations a Relu follows on the CPU.
Graph w4a16_graph(int64_t k, int64_t n, int64_t block, DType x_dtype) {
  const int64_t blocks = int4_block_count(k, block);
  std::vector<int8_t> q(static_cast<size_t>(k * n));
  for (size_t i = 0; i < q.size(); ++i) {
    q[i] = static_cast<int8_t>(static_cast<int>(i * 7 % 16) - 8);
  }
  Tensor wq(DType::I4, {k, n});
  pack_int4(q, wq.mutable_data<uint8_t>());
  std::vector<float> s(static_cast<size_t>(blocks * n));
  for (size_t i = 0; i < s.size(); ++i) s[i] = 0.01f * static_cast<float>(1 + i % 9);
  Graph g;
  g.set_opset("", 21);
  g.inputs.push_back({.name = "x", .dtype = x_dtype});
  g.set_initializer("wq", wq);
  g.set_initializer("ws", Tensor::from_f32(s, {blocks, n}, DType::F16));
  Node dq;
  dq.op_type = "DequantizeLinear";
  dq.inputs = {"wq", "ws"};
  dq.outputs = {"w16"};
  dq.set_attr(attr_int("axis", 0));
  dq.set_attr(attr_int("block_size", block));
  g.nodes.push_back(dq);
  Node mm;
  mm.op_type = "MatMul";
  mm.outputs = {"h"};
  if (x_dtype == DType::F16) {
    mm.inputs = {"x", "w16"};
    g.nodes.push_back(mm);
    g.outputs.push_back({.name = "h"});
    return g;
  }
  Node cast;
  cast.op_type = "Cast";
  cast.inputs = {"w16"};
  cast.outputs = {"w"};
  cast.set_attr(attr_int("to", dtype_to_onnx(DType::F32)));
  mm.inputs = {"x", "w"};
  Node relu;  // a CPU op after the device product: the value comes back
  relu.op_type = "Relu";
  relu.inputs = {"h"};
  relu.outputs = {"y"};
  g.nodes.insert(g.nodes.end(), {cast, mm, relu});
  g.outputs.push_back({.name = "y"});
  return g;
}

// One qforge.internal Int4MatMul over fed inputs: A [m, k] f32, W int4 [k, n], f32 scales of
// `scale_rows` rows (ceil(k / block) is right), block 32.
OneNode int4_matmul_node(int64_t m, int64_t k, int64_t n, int64_t scale_rows) {
  Tensor w(DType::I4, {k, n});
  for (auto& b : w.mutable_data<uint8_t>()) b = 0x21;  // q = 1, 2
  return {.op = ops::kInt4MatMulOp,
          .inputs = {random_f32({m, k}, 7), w,
                     f32({scale_rows, n}, std::vector<float>(static_cast<size_t>(scale_rows * n),
                                                             0.5f))},
          .attrs = {attr_int("block_size", 32)},
          .opset = 1,
          .domain = ops::kInternalDomain};
}

Feeds feeds_of(const OneNode& spec) {
  Feeds feeds;
  for (size_t i = 0; i < spec.inputs.size(); ++i) {
    feeds.emplace_back("in" + std::to_string(i), spec.inputs[i]);
  }
  return feeds;
}

// K = 0: a sum of nothing, zeros of shape [m, n] (as MatMul), on `device`.
void expect_empty_reduction_gives_zeros(Device device) {
  const OneNode spec = int4_matmul_node(3, 0, 5, 0);
  RunCounts counts;
  const Tensor y = run_on(one_node_graph(spec), feeds_of(spec), device, &counts);
  EXPECT_EQ(y.shape(), (Shape{3, 5}));
  for (float v : y.to_f32()) EXPECT_EQ(v, 0.0f);
  EXPECT_EQ(counts.device_ops, device == Device::Cuda ? 1 : 0);
}

// Scales of the wrong shape: InvalidInput naming the node, never a read past the tensor.
void expect_bad_scales_refused(Device device) {
  const OneNode spec = int4_matmul_node(2, 64, 4, 1);  // 64 rows in blocks of 32 need 2
  const auto e = catch_error([&] { run_on(one_node_graph(spec), feeds_of(spec), device); });
  EXPECT_EQ(e.category, ErrorCategory::InvalidInput);
  EXPECT_NE(e.message.find("scales / zero points do not hold"), std::string::npos) << e.message;
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
  QFORGE_NEEDS_CUDA_DEVICE("the sample CNN on CUDA is not compared");
  QFORGE_NEEDS_CUBLAS("its Gemm would run on the CPU");
  const Graph g = import_onnx(std::string(QFORGE_SOURCE_DIR) + "/calib_data/sample_cnn.onnx");
  ASSERT_FALSE(g.inputs.empty());
  Shape shape;
  for (const Dim& d : *g.inputs[0].shape) shape.push_back(d.value ? *d.value : 4);
  const Feeds feeds = {{g.inputs[0].name, random_f32(shape, 3)}};
  RunCounts on_cuda, on_cpu;
  expect_close(run_on(g, feeds, Device::Cuda, &on_cuda).to_f32(),
               run_on(g, feeds, Device::Cpu, &on_cpu).to_f32(), 1e-5f);
  EXPECT_GT(on_cuda.device_ops, 0) << "every node ran on the CPU";
  EXPECT_GT(on_cuda.uploads, 0);
  EXPECT_EQ(on_cpu.device_ops, 0);
  EXPECT_EQ(on_cuda.device_ops + on_cuda.cpu_ops, on_cpu.cpu_ops);
}

TEST(ExecutorCuda, W4A16GraphMatchesCpu) {
  QFORGE_NEEDS_CUDA_DEVICE("the W4A16 graph on CUDA is not compared");
  const int64_t m = 16, k = 100, n = 70;
  const Graph g = w4a16_graph(k, n, 32, DType::F32);
  const Feeds feeds = {{"x", random_f32({m, k}, 5)}};
  RunCounts counts;
  expect_close(run_on(g, feeds, Device::Cuda, &counts).to_f32(),
               run_on(g, feeds, Device::Cpu).to_f32(), 1e-5f);
  EXPECT_EQ(counts.device_ops, 1) << "the fused Int4MatMul did not run on the device";
  EXPECT_EQ(counts.cpu_ops, 1);  // the Relu
}

TEST(ExecutorCuda, W4A16Fp16ActivationsWriteFp16OnTheDevice) {
  QFORGE_NEEDS_CUDA_DEVICE("the fp16-output W4A16 product is not compared");
  // M = 1 takes the GEMV kernel, K = 4096 the split-K path; M = 5 the small-M kernel.
  for (const int64_t m : {int64_t{1}, int64_t{5}}) {
    SCOPED_TRACE("m " + std::to_string(m));
    const int64_t k = 4096, n = 256;
    const Graph g = w4a16_graph(k, n, 128, DType::F16);
    const Tensor x = Tensor::from_f32(random_f32({m, k}, 9).to_f32(), {m, k}, DType::F16);
    const Feeds feeds = {{"x", x}};
    RunCounts counts;
    const Tensor gpu = run_on(g, feeds, Device::Cuda, &counts, HalfCompute::PerOp);
    const Tensor cpu = run_on(g, feeds, Device::Cpu, nullptr, HalfCompute::PerOp);
    EXPECT_EQ(gpu.dtype(), DType::F16);
    EXPECT_EQ(counts.device_ops, 1);
    // Sums of 4096 products differ by f32 rounding, then both round once to fp16.
    expect_close(gpu.to_f32(), cpu.to_f32(), 2e-3f);
  }
}

TEST(ExecutorInt4MatMul, EmptyReductionGivesZerosOnCpu) {
  expect_empty_reduction_gives_zeros(Device::Cpu);
}

TEST(ExecutorCuda, Int4MatMulEmptyReductionGivesZeros) {
  QFORGE_NEEDS_CUDA_DEVICE("the device Int4MatMul with K = 0 is not run");
  expect_empty_reduction_gives_zeros(Device::Cuda);
}

TEST(ExecutorInt4MatMul, ScalesOfTheWrongShapeAreRefusedOnCpu) {
  expect_bad_scales_refused(Device::Cpu);
}

TEST(ExecutorCuda, Int4MatMulScalesOfTheWrongShapeAreRefused) {
  QFORGE_NEEDS_CUDA_DEVICE("the device Int4MatMul's shape checks are not run");
  expect_bad_scales_refused(Device::Cuda);
}
