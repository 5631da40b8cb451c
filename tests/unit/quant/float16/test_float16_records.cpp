// Float16 conversion after W4A16 keeps the quantized-tensor records true: a scale it has to
// copy, and a graph output it renames, are what the records then name.
#include <gtest/gtest.h>

#include <random>

#include "quant/float16/float16_convert.h"
#include "quant/w4a16/w4a16.h"

using namespace qforge;

namespace {

Tensor random_tensor(const Shape& shape, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 0.5f);
  std::vector<float> v(shape_numel(shape));
  for (float& x : v) x = dist(rng);
  return Tensor::from_f32(v, shape);
}

Node node(std::string name, std::string op, std::vector<std::string> in,
          std::vector<std::string> out) {
  Node n;
  n.name = std::move(name);
  n.op_type = std::move(op);
  n.inputs = std::move(in);
  n.outputs = std::move(out);
  return n;
}

// x[batch, 64] -> fc1 (MatMulNBits) -> Relu -> fc2 (MatMulNBits) -> y.
Graph nbits_mlp() {
  Graph g;
  g.set_opset("", 17);
  const Dim batch{.param = "batch"};
  g.inputs.push_back(
      {.name = "x", .dtype = DType::F32, .shape = std::vector<Dim>{batch, Dim{.value = 64}}});
  g.set_initializer("w1", random_tensor({64, 32}, 1));
  g.set_initializer("w2", random_tensor({32, 4}, 2));
  g.nodes.push_back(node("fc1", "MatMul", {"x", "w1"}, {"h"}));
  g.nodes.push_back(node("act", "Relu", {"h"}, {"a"}));
  g.nodes.push_back(node("fc2", "MatMul", {"a", "w2"}, {"y"}));
  g.outputs.push_back({.name = "y", .dtype = DType::F32});
  W4A16Options w4;
  w4.block_size = 32;
  w4.format = Int4Format::MatMulNBits;
  w4.exclude_output_projection = false;
  w4.device = Device::Cpu;
  PassReport report;
  make_w4a16_pass(w4)->run(g, report);
  return g;
}

const Node* producer(const Graph& g, const std::string& value) {
  for (const Node& n : g.nodes)
    if (!n.outputs.empty() && n.outputs[0] == value) return &n;
  return nullptr;
}

PassReport convert_to_f16(Graph& g) {
  Float16ConvertOptions options;
  options.act_dtype = DType::F16;  // nothing kept in f32: fc2 converts too
  PassReport report;
  make_float16_convert_pass(options)->run(g, report);
  return report;
}

}  // namespace

TEST(Float16Records, ACopiedScaleIsTheOneTheRecordNames) {
  Graph g = nbits_mlp();
  // The scale is also a graph output, so it cannot be rounded in place: fc1 gets an f16 copy.
  g.outputs.push_back({.name = "w1_nbits_scale", .dtype = DType::F32});
  convert_to_f16(g);
  const QuantRecord* r = g.find_quant_record("w1_nbits");
  ASSERT_NE(r, nullptr);
  const Node* fc1 = producer(g, r->reader);
  ASSERT_NE(fc1, nullptr);
  EXPECT_EQ(fc1->name, "fc1");
  EXPECT_NE(r->scale, "w1_nbits_scale");
  EXPECT_EQ(fc1->inputs[2], r->scale);
  EXPECT_EQ(g.find_initializer(r->scale)->dtype(), DType::F16);
  EXPECT_EQ(g.find_initializer("w1_nbits_scale")->dtype(), DType::F32);
  EXPECT_NO_THROW(g.check_quant_records());
}

TEST(Float16Records, ARenamedOutputOfAQuantizedLayerIsTheRecordsReader) {
  Graph g = nbits_mlp();
  convert_to_f16(g);
  const QuantRecord* r = g.find_quant_record("w2_nbits");
  ASSERT_NE(r, nullptr);
  EXPECT_NE(r->reader, "y") << "fc2 now computes in f16; a Cast gives the f32 output 'y'";
  const Node* fc2 = producer(g, r->reader);
  ASSERT_NE(fc2, nullptr);
  EXPECT_EQ(fc2->name, "fc2");
  const Node* cast = producer(g, "y");
  ASSERT_NE(cast, nullptr);
  EXPECT_EQ(cast->op_type, "Cast");
  EXPECT_EQ(cast->inputs[0], r->reader);
  EXPECT_NO_THROW(g.check_quant_records());
}
