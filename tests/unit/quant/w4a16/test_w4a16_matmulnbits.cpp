#include <gtest/gtest.h>

#include "exporters/onnx/onnx_exporter.h"
#include "importers/onnx/onnx_importer.h"
#include "tests/unit/quant/w4a16/w4a16_fixtures.h"
#include "tests/unit/temp_dir.h"

using namespace qforge;
using namespace qforge::test::w4a16;

namespace {

W4A16Options nbits(int block) {
  W4A16Options o;
  o.block_size = block;
  o.exclude_output_projection = false;
  o.format = Int4Format::MatMulNBits;
  return o;
}

}  // namespace

TEST(W4A16MatMulNBits, RewritesMatMulWithOrtLayout) {
  for (const int64_t k : {64, 40}) {  // exact blocks and a partial last block
    SCOPED_TRACE(testing::Message() << "K " << k);
    Graph g = mlp(k, 6, 3, 4);
    const Tensor w1 = *g.find_initializer("w1");
    const PassReport report = run_pass(g, nbits(32));
    EXPECT_EQ(report.stats["quantized"], 2);
    EXPECT_EQ(find_op(g, "DequantizeLinear"), nullptr);
    EXPECT_EQ(g.opset("com.microsoft"), 1);
    EXPECT_EQ(g.opset(), 17);  // nothing needs opset 21 here
    const Node* node = find_op(g, "MatMulNBits");
    ASSERT_NE(node, nullptr);
    EXPECT_EQ(node->domain, "com.microsoft");
    EXPECT_EQ(node->attr_int("K", 0), k);
    EXPECT_EQ(node->attr_int("N", 0), 6);
    EXPECT_EQ(node->attr_int("bits", 0), 4);
    EXPECT_EQ(node->attr_int("block_size", 0), 32);
    ASSERT_EQ(node->inputs.size(), 3u);
    EXPECT_EQ(node->inputs[0], "x");
    const Tensor* b = g.find_initializer(node->inputs[1]);
    const Tensor* s = g.find_initializer(node->inputs[2]);
    ASSERT_NE(b, nullptr);
    ASSERT_NE(s, nullptr);
    const int64_t blocks = (k + 31) / 32;
    EXPECT_EQ(b->dtype(), DType::U8);
    EXPECT_EQ(b->shape(), (Shape{6, blocks, 16}));
    EXPECT_EQ(s->dtype(), DType::F32);  // A's dtype
    EXPECT_EQ(s->shape(), (Shape{6 * blocks}));
    // (nibble - 8) * scale reproduces the reference; padding past K holds the zero point 8.
    const auto bytes = b->data<uint8_t>();
    const std::vector<float> scales = s->to_f32();
    const std::vector<float> ref = reference_dequantized(w1, 0, 32);
    for (int64_t n = 0; n < 6; ++n) {
      for (int64_t kk = 0; kk < blocks * 32; ++kk) {
        const int64_t blk = kk / 32, j = kk % 32;
        const uint8_t byte = bytes[static_cast<size_t>((n * blocks + blk) * 16 + j / 2)];
        const int nib = j % 2 == 0 ? (byte & 0xf) : (byte >> 4);
        if (kk >= k) {
          ASSERT_EQ(nib, 8) << "padding at k " << kk;
          continue;
        }
        const float v = static_cast<float>(nib - 8) * scales[static_cast<size_t>(n * blocks + blk)];
        ASSERT_EQ(f16_to_f32(f32_to_f16(v)), ref[static_cast<size_t>(kk * 6 + n)])
            << "n " << n << " k " << kk;
      }
    }
  }
}

TEST(W4A16MatMulNBits, GemmKeepsBlockedDequantize) {
  Graph g;
  g.set_opset("", 17);
  g.inputs.push_back({.name = "x", .dtype = DType::F32});
  g.set_initializer("w", random_weight({8, 64}, 3));
  g.nodes.push_back(
      make_node("gemm", "Gemm", {"x", "w"}, {"h"}, {Attribute::make_int("transB", 1)}));
  g.nodes.push_back(make_node("act", "Relu", {"h"}, {"y"}));
  g.outputs.push_back({.name = "y"});
  run_pass(g, nbits(32));
  EXPECT_EQ(find_op(g, "MatMulNBits"), nullptr);
  ASSERT_NE(find_op(g, "DequantizeLinear"), nullptr);
  EXPECT_EQ(g.opset(), 21);
  EXPECT_EQ(g.opset("com.microsoft"), 0);
}

TEST(W4A16Export, BlockedInt4RoundTripsThroughOnnx) {
  const test::TempDir dir;
  const Graph original = mlp(72, 16, 5, 12);
  Graph quantized = original;
  W4A16Options blocked = nbits(32);
  blocked.format = Int4Format::OnnxBlocked;
  run_pass(quantized, blocked);
  const auto path = dir.path() / "w4a16.onnx";
  export_onnx(quantized, path);  // (the exporter's checker stops at opset 17; the interop test
                                 // runs onnx's full_check on this form)
  const Graph reloaded = import_onnx(path);
  const Tensor x = random_weight({2, 72}, 3);
  const Tensor a = run_graph(quantized, x);
  const Tensor b = run_graph(reloaded, x);
  ASSERT_EQ(a.shape(), b.shape());
  EXPECT_EQ(a.to_f32(), b.to_f32());
}

TEST(W4A16Export, MatMulNBitsModelExports) {
  const test::TempDir dir;
  Graph g = mlp(64, 16, 4, 2);
  run_pass(g, nbits(32));
  const auto path = dir.path() / "nbits.onnx";
  export_onnx(g, path);  // opset 17 plus com.microsoft 1: onnx::checker runs here
  const Graph reloaded = import_onnx(path);
  const Node* node = find_op(reloaded, "MatMulNBits");
  ASSERT_NE(node, nullptr);
  EXPECT_EQ(node->domain, "com.microsoft");
  EXPECT_EQ(reloaded.opset("com.microsoft"), 1);
}
