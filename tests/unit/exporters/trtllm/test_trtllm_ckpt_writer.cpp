// TensorRT-LLM checkpoint: the adjacent-row int4 packing of known values, q/k/v fused per rank
// whatever order they arrive in, and the refusals (INT8 per channel, an unfinished qkv, a
// model that is not Llama, a tp that does not divide the heads) leaving nothing behind.
#include "exporters/trtllm/trtllm_ckpt_writer.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "importers/safetensors/safetensors_reader.h"
#include "ir/error.h"
#include "ir/quantized_linear.h"
#include "tests/unit/temp_dir.h"

using namespace qforge;

namespace {

namespace fs = std::filesystem;

Tensor int4_values(const std::vector<int8_t>& q, Shape shape) {
  Tensor t(DType::I4, std::move(shape));
  auto b = t.mutable_data<uint8_t>();
  for (size_t i = 0; i < q.size(); ++i) {
    b[i / 2] = static_cast<uint8_t>(b[i / 2] | ((q[i] & 0x0f) << (4 * (i % 2))));
  }
  return t;
}

// A part with one quantized Linear [n, 128], groups of 64, values (row - 8) mod 16.
Graph linear(const std::string& weight, int64_t n) {
  Graph g;
  g.set_initializer(weight, Tensor(DType::F16, {n, 128}));
  std::vector<int8_t> q(static_cast<size_t>(n * 128));
  for (size_t i = 0; i < q.size(); ++i) {
    q[i] = static_cast<int8_t>(static_cast<int>((i / 128) % 16) - 8);
  }
  store_quantized_linear(g, weight, int4_values(q, {n, 128}), Tensor(DType::F16, {n, 2}), 64);
  return g;
}

Graph float_part(const std::string& name, Shape shape) {
  Graph g;
  g.set_initializer(name, Tensor(DType::F16, std::move(shape)));
  return g;
}

class TrtllmCkptWriterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fs::create_directories(dir_ / "src");
    config_ = {{"architectures", {"LlamaForCausalLM"}}, {"hidden_size", 128},
               {"num_attention_heads", 4}, {"num_key_value_heads", 2},
               {"intermediate_size", 256}, {"num_hidden_layers", 1}, {"vocab_size", 7},
               {"tie_word_embeddings", true}, {"rms_norm_eps", 1e-5}};
    write_config();
  }
  void write_config() { std::ofstream(dir_ / "src" / "config.json") << config_.dump(); }
  QuantCheckpointOptions options(int tp) const {
    QuantCheckpointOptions o;
    o.source_dir = dir_ / "src";
    o.tensor_parallel = tp;
    return o;
  }
  bool only_src_left() const {
    for (const auto& e : fs::directory_iterator(dir_.path())) {
      if (e.path().filename() != "src") return false;
    }
    return true;
  }
  test::TempDir dir_;
  nlohmann::json config_;
};

}  // namespace

TEST(PackInt4AdjacentRows, EvenRowLowNibbleOddRowHigh) {
  // rows: [-8, 1, 7], [-1, 0, 3], [2, -3, 4], [5, 6, -7]
  const Tensor v = int4_values({-8, 1, 7, -1, 0, 3, 2, -3, 4, 5, 6, -7}, {4, 3});
  const Tensor p = pack_int4_adjacent_rows(v);
  EXPECT_EQ(p.dtype(), DType::I8);
  EXPECT_EQ(p.shape(), (Shape{2, 3}));
  const auto b = p.data<uint8_t>();
  EXPECT_EQ(std::vector<uint8_t>(b.begin(), b.end()),
            (std::vector<uint8_t>{0xF8, 0x01, 0x37, 0x52, 0x6D, 0x94}));
  // An even column count goes a byte (two columns) at a time: every value in every place.
  const int64_t n = 6, k = 10;
  std::vector<int8_t> q(static_cast<size_t>(n * k));
  for (size_t i = 0; i < q.size(); ++i) q[i] = static_cast<int8_t>((i * 7 + i / 3) % 16 - 8);
  const Tensor even = pack_int4_adjacent_rows(int4_values(q, {n, k}));
  ASSERT_EQ(even.shape(), (Shape{n / 2, k}));
  const auto e = even.data<uint8_t>();
  for (int64_t i = 0; i < n / 2; ++i) {
    for (int64_t c = 0; c < k; ++c) {
      const auto lo = static_cast<uint8_t>(q[static_cast<size_t>(2 * i * k + c)] & 0x0f);
      const auto hi = static_cast<uint8_t>(q[static_cast<size_t>((2 * i + 1) * k + c)] & 0x0f);
      EXPECT_EQ(e[static_cast<size_t>(i * k + c)], lo | (hi << 4)) << i << ", " << c;
    }
  }
}

TEST_F(TrtllmCkptWriterTest, QkvFusedPerRankInAnyOrderAndTiedLmHeadPadded) {
  TrtllmCkptWriter w(dir_ / "out", options(2));
  w.add(linear("model.layers.0.self_attn.v_proj.weight", 64));
  w.add(float_part("model.layers.0.input_layernorm.weight", {128}));
  w.add(linear("model.layers.0.self_attn.q_proj.weight", 128));
  w.add(float_part("model.embed_tokens.weight", {7, 128}));
  w.add(linear("model.layers.0.self_attn.k_proj.weight", 64));
  w.add(linear("model.layers.0.self_attn.o_proj.weight", 128));
  w.finish();
  EXPECT_EQ(w.quantized_linears(), 2);
  for (int r = 0; r < 2; ++r) {
    const Graph g = import_safetensors(dir_ / "out" / ("rank" + std::to_string(r) +
                                                        ".safetensors"));
    const Tensor* qkv = g.find_initializer("transformer.layers.0.attention.qkv.weight");
    ASSERT_NE(qkv, nullptr);
    EXPECT_EQ(qkv->dtype(), DType::I8);
    EXPECT_EQ(qkv->shape(), (Shape{64, 128}));  // (64 + 32 + 32) rows / 2
    // Rank r's q rows are 64r.., then k's and v's 32r..: row i holds (i - 8) mod 16.
    const auto b = qkv->data<uint8_t>();
    const auto q_of = [](int64_t row) { return static_cast<uint8_t>((row % 16 - 8) & 0x0f); };
    EXPECT_EQ(b[0], q_of(64 * r) | (q_of(64 * r + 1) << 4));
    EXPECT_EQ(b[32 * 128], q_of(32 * r) | (q_of(32 * r + 1) << 4));  // k's first pair
    EXPECT_EQ(g.find_initializer("transformer.layers.0.attention.qkv.weights_scaling_factor")
                  ->shape(), (Shape{128, 2}));
    EXPECT_EQ(g.find_initializer("transformer.layers.0.attention.dense.weight")->shape(),
              (Shape{64, 64}));
    EXPECT_EQ(g.find_initializer("transformer.layers.0.attention.dense.weights_scaling_factor")
                  ->shape(), (Shape{128, 1}));
    EXPECT_EQ(g.find_initializer("lm_head.weight")->shape(), (Shape{4, 128}));  // 7 -> 8 / 2
    EXPECT_EQ(g.find_initializer("transformer.vocab_embedding.weight")->shape(),
              (Shape{7, 128}));
  }
  std::ifstream f(dir_ / "out" / "config.json");
  const auto cfg = nlohmann::json::parse(f);
  EXPECT_EQ(cfg["quantization"]["quant_algo"], "W4A16_AWQ");
  EXPECT_EQ(cfg["quantization"]["group_size"], 64);
  EXPECT_EQ(cfg["quantization"]["pre_quant_scale"], false);
  EXPECT_EQ(cfg["mapping"]["tp_size"], 2);
}

TEST_F(TrtllmCkptWriterTest, RefusalsLeaveNothingBehind) {
  {  // INT8 per channel: the engine's layout for it is GPU-specific
    TrtllmCkptWriter w(dir_ / "out", options(1));
    Graph g;
    g.set_initializer("model.layers.0.mlp.up_proj.weight", Tensor(DType::F16, {4, 128}));
    store_quantized_linear(g, "model.layers.0.mlp.up_proj.weight", Tensor(DType::I8, {4, 128}),
                           Tensor(DType::F16, {4}), 0);
    try {
      w.add(g);
      FAIL() << "int8 per channel was written";
    } catch (const Error& e) {
      EXPECT_EQ(e.category(), ErrorCategory::Unsupported);
      EXPECT_NE(std::string(e.what()).find("preprocess_weights_for_mixed_gemm"),
                std::string::npos);
    }
  }
  EXPECT_TRUE(only_src_left());
  {  // q without k and v
    TrtllmCkptWriter w(dir_ / "out", options(1));
    w.add(float_part("model.embed_tokens.weight", {7, 128}));
    w.add(linear("model.layers.0.self_attn.q_proj.weight", 128));
    EXPECT_THROW(w.finish(), Error);
  }
  EXPECT_TRUE(only_src_left());
  {  // a tensor the Llama checkpoint has no place for
    TrtllmCkptWriter w(dir_ / "out", options(1));
    EXPECT_THROW(w.add(float_part("model.layers.0.self_attn.q_proj.bias", {128})), Error);
  }
  EXPECT_TRUE(only_src_left());
  EXPECT_THROW(TrtllmCkptWriter(dir_ / "out", options(3)), Error);  // 4 heads, 2 kv heads
  QuantCheckpointOptions file = options(1);
  file.folder = false;
  EXPECT_THROW(TrtllmCkptWriter(dir_ / "out.safetensors", file), Error);
  config_["architectures"] = {"Qwen2ForCausalLM"};
  write_config();
  EXPECT_THROW(TrtllmCkptWriter(dir_ / "out", options(1)), Error);
  EXPECT_TRUE(only_src_left());
}

TEST_F(TrtllmCkptWriterTest, RopeFromEitherTransformersConfigStyle) {
  const auto written = [&](const std::string& out) {
    TrtllmCkptWriter w(dir_ / out, options(1));
    w.add(float_part("model.embed_tokens.weight", {7, 128}));
    w.finish();
    std::ifstream f(dir_ / out / "config.json");
    return nlohmann::json::parse(f);
  };
  // transformers 5: rope_parameters (rope_theta inside), Llama 3 scaling.
  config_["rope_parameters"] = {{"rope_type", "llama3"}, {"rope_theta", 500000.0},
                                {"factor", 32.0}, {"low_freq_factor", 1.0},
                                {"high_freq_factor", 4.0},
                                {"original_max_position_embeddings", 8192}};
  write_config();
  auto cfg = written("five");
  EXPECT_EQ(cfg["rotary_base"], 500000.0);
  EXPECT_EQ(cfg["rotary_scaling"]["rope_type"], "llama3");
  EXPECT_EQ(cfg["rotary_scaling"]["factor"], 32.0);
  EXPECT_FALSE(cfg["rotary_scaling"].contains("rope_theta"));
  EXPECT_EQ(cfg["quantization"]["quant_algo"], nullptr);  // nothing quantized
  EXPECT_EQ(cfg["dtype"], "float16");
  // transformers 4: rope_theta and rope_scaling beside the other keys.
  config_.erase("rope_parameters");
  config_["rope_theta"] = 1000000.0;
  config_["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
  write_config();
  cfg = written("four");
  EXPECT_EQ(cfg["rotary_base"], 1000000.0);
  EXPECT_EQ(cfg["rotary_scaling"], config_["rope_scaling"]);
  EXPECT_EQ(cfg["norm_epsilon"], 1e-5);
  EXPECT_EQ(cfg["position_embedding_type"], "rope_gpt_neox");
}
