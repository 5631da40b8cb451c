#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "cli/option_parsers.h"
#include "ir/error.h"
#include "ir/half.h"
#include "quant/float16/float16_convert.h"
#include "quant/w4a16/w4a16.h"
#include "runtime/executor.h"

using namespace qforge;

namespace {

Tensor random_tensor(const Shape& shape, uint32_t seed, float scale = 0.5f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(shape_numel(shape));
  for (float& x : v) x = dist(rng);
  return Tensor::from_f32(v, shape);
}

Node node(std::string name, std::string op, std::vector<std::string> in,
          std::vector<std::string> out, std::vector<Attribute> attrs = {}) {
  Node n;
  n.name = std::move(name);
  n.op_type = std::move(op);
  n.inputs = std::move(in);
  n.outputs = std::move(out);
  n.attributes = std::move(attrs);
  return n;
}

// x[batch, 16] -> MatMul w1 -> Add b1 -> LayerNormalization -> Relu -> Softmax
//   -> MatMul w2 -> Add b2 -> y (the output projection)
Graph block_graph() {
  Graph g;
  g.set_opset("", 17);
  const Dim batch{.param = "batch"};
  g.inputs.push_back(
      {.name = "x", .dtype = DType::F32, .shape = std::vector<Dim>{batch, Dim{.value = 16}}});
  g.set_initializer("w1", random_tensor({16, 32}, 1));
  g.set_initializer("b1", random_tensor({32}, 2));
  g.set_initializer("gamma", random_tensor({32}, 3, 1.0f));
  g.set_initializer("beta", random_tensor({32}, 4));
  g.set_initializer("w2", random_tensor({32, 8}, 5));
  g.set_initializer("b2", random_tensor({8}, 6));
  g.nodes.push_back(node("fc1", "MatMul", {"x", "w1"}, {"h"}));
  g.nodes.push_back(node("bias1", "Add", {"h", "b1"}, {"hb"}));
  g.nodes.push_back(node("ln", "LayerNormalization", {"hb", "gamma", "beta"}, {"n"},
                         {Attribute::make_int("axis", -1)}));
  g.nodes.push_back(node("act", "Relu", {"n"}, {"a"}));
  g.nodes.push_back(node("sm", "Softmax", {"a"}, {"p"}, {Attribute::make_int("axis", -1)}));
  g.nodes.push_back(node("fc2", "MatMul", {"p", "w2"}, {"o"}));
  g.nodes.push_back(node("bias2", "Add", {"o", "b2"}, {"y"}));
  g.outputs.push_back({.name = "y", .dtype = DType::F32});
  return g;
}

PassReport convert(Graph& g, Float16ConvertOptions options) {
  PassReport report;
  report.pass = "float16";
  make_float16_convert_pass(std::move(options))->run(g, report);
  return report;
}

Float16ConvertOptions defaults(DType act = DType::F16) {
  Float16ConvertOptions o;
  o.act_dtype = act;
  o.keep_fp32_ops = default_keep_fp32_ops();
  return o;
}

const Node* producer(const Graph& g, const std::string& value) {
  for (const Node& n : g.nodes)
    for (const auto& out : n.outputs)
      if (out == value) return &n;
  return nullptr;
}
const Node* by_name(const Graph& g, const std::string& name) {
  for (const Node& n : g.nodes)
    if (n.name == name) return &n;
  return nullptr;
}
int count_op(const Graph& g, const std::string& op) {
  int c = 0;
  for (const Node& n : g.nodes) c += n.op_type == op;
  return c;
}
// The dtype a value has: initializer, graph input or the Cast/float rule of its producer.
DType cast_target(const Node& cast) {
  return *dtype_from_onnx(static_cast<int>(cast.attr_int("to", 0)));
}

std::vector<float> run(const Graph& g, const Tensor& x) {
  Executor ex(g, {.device = Device::Cpu, .threads = 2});
  return ex.run({{"x", x}}).at(0).to_f32();
}

}  // namespace

TEST(Float16Convert, ConvertsWeightsAndCastsAtTheBoundary) {
  Graph g = block_graph();
  const Tensor w1 = *g.find_initializer("w1");
  const PassReport report = convert(g, defaults());
  // I/O keep f32 (keep_io_types): a Cast after x, one before y.
  EXPECT_EQ(g.inputs[0].dtype, DType::F32);
  EXPECT_EQ(g.outputs[0].dtype, DType::F32);
  const Node* fc1 = by_name(g, "fc1");
  ASSERT_NE(fc1, nullptr);
  const Node* x_cast = producer(g, fc1->inputs[0]);
  ASSERT_NE(x_cast, nullptr);
  EXPECT_EQ(x_cast->op_type, "Cast");
  EXPECT_EQ(x_cast->inputs[0], "x");
  EXPECT_EQ(cast_target(*x_cast), DType::F16);
  // w1 converted in place, rounded to nearest even.
  EXPECT_EQ(fc1->inputs[1], "w1");
  const Tensor* w1h = g.find_initializer("w1");
  ASSERT_NE(w1h, nullptr);
  ASSERT_EQ(w1h->dtype(), DType::F16);
  const auto src = w1.data<float>();
  const auto dst = w1h->data<uint16_t>();
  for (size_t i = 0; i < src.size(); ++i) ASSERT_EQ(dst[i], f32_to_f16(src[i])) << i;
  EXPECT_EQ(g.find_initializer("b1")->dtype(), DType::F16);
  // LayerNormalization kept: f32 input through a Cast, its scale and bias stay f32.
  const Node* ln = by_name(g, "ln");
  const Node* to32 = producer(g, ln->inputs[0]);
  ASSERT_NE(to32, nullptr);
  EXPECT_EQ(to32->op_type, "Cast");
  EXPECT_EQ(cast_target(*to32), DType::F32);
  EXPECT_EQ(g.find_initializer("gamma")->dtype(), DType::F32);
  // Relu is converted: a Cast back to f16 after LayerNormalization; Softmax kept: to f32.
  const Node* relu = by_name(g, "act");
  const Node* to16 = producer(g, relu->inputs[0]);
  ASSERT_NE(to16, nullptr);
  EXPECT_EQ(to16->op_type, "Cast");
  EXPECT_EQ(cast_target(*to16), DType::F16);
  EXPECT_EQ(producer(g, by_name(g, "sm")->inputs[0])->op_type, "Cast");
  // The output projection (fc2 + bias2 -> y) is kept: reads Softmax's f32 output directly.
  EXPECT_EQ(by_name(g, "fc2")->inputs[0], "p");
  EXPECT_EQ(g.find_initializer("w2")->dtype(), DType::F32);
  EXPECT_EQ(report.stats["kept"]["output-projection"], 2);  // fc2 and its bias Add
  EXPECT_EQ(report.stats["kept"]["LayerNormalization"], 1);
  EXPECT_EQ(report.stats["kept"]["Softmax"], 1);
  EXPECT_EQ(report.stats["act_dtype"], "f16");
  EXPECT_EQ(count_op(g, "Cast"), 4);  // x, before ln, after ln, before sm
  EXPECT_EQ(report.stats["casts_inserted"], 4);
}

TEST(Float16Convert, RunsCloseToTheFloatGraph) {
  for (const DType act : {DType::F16, DType::BF16}) {
    Graph g = block_graph();
    const Graph original = g;
    convert(g, defaults(act));
    const Tensor x = random_tensor({4, 16}, 9, 1.0f);
    const auto want = run(original, x);
    const auto got = run(g, x);
    ASSERT_EQ(got.size(), want.size());
    const float tol = act == DType::F16 ? 2e-3f : 2e-2f;
    for (size_t i = 0; i < got.size(); ++i)
      EXPECT_NEAR(got[i], want[i], tol * (1.0f + std::fabs(want[i])))
          << dtype_name(act) << " " << i;
    // One rounding per op: the result differs from the f32 graph (the test sees the dtype).
    EXPECT_NE(got, want);
  }
}

TEST(Float16Convert, NoKeptOpsMeansNoInnerCasts) {
  Graph g = block_graph();
  Float16ConvertOptions o = defaults();
  o.keep_fp32_ops = parse_keep_fp32("none");
  const PassReport report = convert(g, o);
  EXPECT_EQ(count_op(g, "Cast"), 2);  // only the boundary
  EXPECT_EQ(g.find_initializer("w2")->dtype(), DType::F16);
  EXPECT_EQ(g.find_initializer("gamma")->dtype(), DType::F16);
  EXPECT_EQ(report.stats["kept_nodes"], 0);
}

TEST(Float16Convert, KeepIoTypesOffChangesTheGraphSignature) {
  Graph g = block_graph();
  Float16ConvertOptions o = defaults();
  o.keep_fp32_ops = parse_keep_fp32("none");
  o.keep_io_types = false;
  convert(g, o);
  EXPECT_EQ(g.inputs[0].dtype, DType::F16);
  EXPECT_EQ(g.outputs[0].dtype, DType::F16);
  EXPECT_EQ(count_op(g, "Cast"), 0);
  EXPECT_EQ(by_name(g, "fc1")->inputs[0], "x");
}

TEST(Float16Convert, InitializerSharedWithKeptOpKeepsItsF32Original) {
  Graph g;
  g.set_opset("", 17);
  g.inputs.push_back({.name = "x", .dtype = DType::F32});
  g.set_initializer("c", random_tensor({8}, 3));
  g.set_initializer("two", Tensor::from_f32(std::vector<float>{2.0f}, {}));
  g.nodes.push_back(node("sub", "Sub", {"x", "c"}, {"d"}));
  g.nodes.push_back(node("sq", "Pow", {"c", "two"}, {"c2"}));
  g.nodes.push_back(node("mul", "Mul", {"d", "c2"}, {"y"}));
  g.outputs.push_back({.name = "y", .dtype = DType::F32});
  const Tensor c = *g.find_initializer("c");
  convert(g, defaults());
  EXPECT_TRUE(g.find_initializer("c")->equals(c));  // the f32 original for Pow
  const Node* sub = by_name(g, "sub");
  ASSERT_NE(sub->inputs[1], "c");
  const Tensor* ch = g.find_initializer(sub->inputs[1]);
  ASSERT_NE(ch, nullptr);
  EXPECT_EQ(ch->dtype(), DType::F16);
  EXPECT_EQ(by_name(g, "sq")->inputs[0], "c");
  EXPECT_EQ(g.find_initializer("two")->dtype(), DType::F32);  // only Pow reads it
}

TEST(Float16Convert, DequantizeCastPairDisappears) {
  // The W4A16 output: DequantizeLinear (fp16 scale) -> Cast(to f32) -> MatMul.
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
  w4.device = Device::Cpu;
  PassReport r;
  make_w4a16_pass(w4)->run(g, r);
  ASSERT_EQ(count_op(g, "DequantizeLinear"), 1);
  ASSERT_EQ(count_op(g, "Cast"), 1);
  const Graph quantized = g;

  const PassReport report = convert(g, defaults());
  const Node* fc1 = by_name(g, "fc1");
  EXPECT_EQ(producer(g, fc1->inputs[1])->op_type, "DequantizeLinear");
  EXPECT_EQ(report.stats["casts_removed"], 1);
  // Left: Cast(x -> f16) and Cast(a -> f32) in front of the kept output projection.
  EXPECT_EQ(count_op(g, "Cast"), 2);

  Graph b = quantized;
  convert(b, defaults(DType::BF16));
  const Node* cast = producer(b, by_name(b, "fc1")->inputs[1]);
  ASSERT_EQ(cast->op_type, "Cast");
  EXPECT_EQ(cast_target(*cast), DType::BF16);
  EXPECT_EQ(producer(b, cast->inputs[0])->op_type, "DequantizeLinear");

  // A kept reader of the dequantized weight casts the exact f16 values, not a bf16 copy.
  Graph k = quantized;
  Float16ConvertOptions o = defaults(DType::BF16);
  o.keep_fp32_ops = {"MatMul", "Relu"};
  convert(k, o);
  const Node* kc = producer(k, by_name(k, "fc1")->inputs[1]);
  ASSERT_EQ(kc->op_type, "Cast");
  EXPECT_EQ(cast_target(*kc), DType::F32);
  EXPECT_EQ(producer(k, kc->inputs[0])->op_type, "DequantizeLinear");
  const Tensor x = random_tensor({3, 64}, 4);
  EXPECT_EQ(run(k, x), run(quantized, x));  // every op kept: bit-identical
}

TEST(Float16Convert, ShapeAndIntegerOpsAreUntouched) {
  // y = x * Cast(Range(0, Shape(x)[1], 1)) with an f32 Range kept and an int64 path intact.
  Graph g;
  g.set_opset("", 17);
  g.inputs.push_back({.name = "x",
                      .dtype = DType::F32,
                      .shape = std::vector<Dim>{Dim{.value = 2}, Dim{.value = 5}}});
  Tensor idx(DType::I64, {});
  idx.mutable_data<int64_t>()[0] = 1;
  g.set_initializer("one_i", idx);
  g.set_initializer("zero_f", Tensor::from_f32(std::vector<float>{0.0f}, {}));
  g.set_initializer("one_f", Tensor::from_f32(std::vector<float>{1.0f}, {}));
  g.nodes.push_back(node("shape", "Shape", {"x"}, {"s"}));
  g.nodes.push_back(node("pick", "Gather", {"s", "one_i"}, {"n"}));
  g.nodes.push_back(node("tof", "Cast", {"n"}, {"nf"}, {Attribute::make_int("to", 1)}));
  g.nodes.push_back(node("range", "Range", {"zero_f", "nf", "one_f"}, {"r"}));
  g.nodes.push_back(node("mul", "Mul", {"x", "r"}, {"y"}));
  g.outputs.push_back({.name = "y", .dtype = DType::F32});
  const Graph original = g;
  const PassReport report = convert(g, defaults());
  EXPECT_EQ(g.find_initializer("one_i")->dtype(), DType::I64);
  EXPECT_EQ(g.find_initializer("zero_f")->dtype(), DType::F32);  // Range runs in f32
  EXPECT_EQ(report.stats["kept"]["Range (f32 only)"], 1);
  // Shape reads x itself (any type will do), no Cast in between.
  EXPECT_EQ(by_name(g, "shape")->inputs[0], "x");
  // Cast(to f32) feeding the f32-only Range keeps its target.
  EXPECT_EQ(by_name(g, "tof")->attr_int("to", 0), 1);
  const Tensor x = random_tensor({2, 5}, 3);
  const auto want = run(original, x);
  const auto got = run(g, x);
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 4e-3f) << i;
}

TEST(Float16Convert, CastTargetsAndConstantsFollowTheActivationDtype) {
  // y = Cast(mask, to f32) * Constant(-FLT_MAX) + x: the constant saturates to -65504.
  Graph g;
  g.set_opset("", 17);
  g.inputs.push_back({.name = "x", .dtype = DType::F32});
  g.inputs.push_back({.name = "mask", .dtype = DType::I64});
  Attribute big;
  big.name = "value";
  big.type = AttrType::Tensor;
  big.t = Tensor::from_f32(std::vector<float>{-3.4028234e38f}, {});
  g.nodes.push_back(node("k", "Constant", {}, {"big"}, {big}));
  g.nodes.push_back(node("tof", "Cast", {"mask"}, {"mf"}, {Attribute::make_int("to", 1)}));
  g.nodes.push_back(node("scale", "Mul", {"mf", "big"}, {"m"}));
  g.nodes.push_back(node("add", "Add", {"x", "m"}, {"y"}));
  g.outputs.push_back({.name = "y", .dtype = DType::F32});
  const PassReport report = convert(g, defaults());
  EXPECT_EQ(by_name(g, "tof")->attr_int("to", 0), 10);
  const Attribute* v = by_name(g, "k")->attr("value");
  ASSERT_NE(v, nullptr);
  ASSERT_EQ(v->t.dtype(), DType::F16);
  EXPECT_EQ(v->t.to_f32()[0], -65504.0f);
  EXPECT_EQ(report.stats["clamped_values"], 1);
  ASSERT_EQ(report.warnings.size(), 1u);

  Executor ex(g, {.device = Device::Cpu, .threads = 1});
  Tensor mask(DType::I64, {2});
  mask.mutable_data<int64_t>()[0] = 0;
  mask.mutable_data<int64_t>()[1] = 1;
  const auto y =
      ex.run({{"x", Tensor::from_f32(std::vector<float>{0.5f, 0.5f}, {2})}, {"mask", mask}})
          .at(0)
          .to_f32();
  EXPECT_EQ(y[0], 0.5f);
  EXPECT_EQ(y[1], -65504.0f);  // finite: no NaN from 0 * -inf in a later step
}

TEST(Float16Convert, RefusesSubgraphs) {
  Graph g = block_graph();
  Attribute body;
  body.name = "then_branch";
  body.type = AttrType::Graph;
  body.g = std::make_shared<Graph>();
  g.nodes.push_back(node("branch", "If", {"y"}, {"z"}, {body}));
  try {
    convert(g, defaults());
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), ErrorCategory::Unsupported);
    EXPECT_NE(std::string(e.what()).find("If 'branch'"), std::string::npos) << e.what();
  }
}

TEST(Float16Convert, ParsesKeepFp32) {
  EXPECT_TRUE(parse_keep_fp32("none").empty());
  const auto d = parse_keep_fp32("default,Gelu");
  EXPECT_EQ(d.size(), default_keep_fp32_ops().size() + 1);
  EXPECT_EQ(d.back(), "Gelu");
  EXPECT_EQ(parse_keep_fp32("Softmax"), std::vector<std::string>{"Softmax"});
  try {
    parse_keep_fp32("Softmax,,Pow");
    FAIL() << "expected a usage error";
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), ErrorCategory::Usage);
  }
  Float16ConvertOptions o;
  o.act_dtype = DType::F32;
  EXPECT_THROW(make_float16_convert_pass(o), Error);
}

TEST(Float16Convert, OutputIsIdenticalForAnyThreadCount) {
  Graph g = block_graph();
  convert(g, defaults());
  const Tensor x = random_tensor({8, 16}, 11, 1.0f);
  Executor one(g, {.device = Device::Cpu, .threads = 1});
  Executor four(g, {.device = Device::Cpu, .threads = 4});
  EXPECT_TRUE(one.run({{"x", x}}).at(0).equals(four.run({{"x", x}}).at(0)));
}
