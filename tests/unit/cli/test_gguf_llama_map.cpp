// The Llama-to-GGUF mapping: convert_hf_to_gguf.py's Q/K row permutation, the names and types
// chosen per output type, and refusals that name the tensor.
#include <gtest/gtest.h>

#include <numeric>
#include <string>

#include "cli/gguf_llama_map.h"
#include "ir/error.h"

using namespace qforge;
using namespace qforge::cli;

namespace {

HfConfig tiny_config() {
  HfConfig c;
  c.architectures = {"LlamaForCausalLM"};
  c.hidden_size = 64;
  c.intermediate_size = 96;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 16;
  c.vocab_size = 40;
  c.num_hidden_layers = 1;
  c.max_position_embeddings = 128;
  return c;
}

Graph tiny_weights(bool with_output) {
  Graph g;
  auto add = [&g](const std::string& name, Shape shape) {
    g.set_initializer(name, Tensor(DType::F32, std::move(shape)));
  };
  add("model.embed_tokens.weight", {40, 64});
  add("model.layers.0.input_layernorm.weight", {64});
  add("model.layers.0.self_attn.q_proj.weight", {64, 64});
  add("model.layers.0.self_attn.k_proj.weight", {32, 64});
  add("model.layers.0.self_attn.v_proj.weight", {32, 64});
  add("model.layers.0.self_attn.o_proj.weight", {64, 64});
  add("model.layers.0.post_attention_layernorm.weight", {64});
  add("model.layers.0.mlp.gate_proj.weight", {96, 64});
  add("model.layers.0.mlp.up_proj.weight", {96, 64});
  add("model.layers.0.mlp.down_proj.weight", {64, 96});
  add("model.norm.weight", {64});
  if (with_output) add("lm_head.weight", {40, 64});
  return g;
}

const GgufTensorPlan& find(const std::vector<GgufTensorPlan>& plan, const std::string& name) {
  for (const auto& p : plan) {
    if (p.name == name) return p;
  }
  throw std::runtime_error("no " + name);
}

}  // namespace

TEST(GgufLlamaMap, PermutesRowsIntoInterleavedPairs) {
  std::vector<float> w(8 * 2);
  std::iota(w.begin(), w.end(), 0.0f);  // row r holds 2r, 2r + 1
  const auto out = permute_rope_rows(w, 8, 2, 2);
  const int want_rows[] = {0, 2, 1, 3, 4, 6, 5, 7};
  for (int r = 0; r < 8; ++r) {
    EXPECT_EQ(out[r * 2], static_cast<float>(want_rows[r] * 2)) << r;
    EXPECT_EQ(out[r * 2 + 1], static_cast<float>(want_rows[r] * 2 + 1)) << r;
  }
}

TEST(GgufLlamaMap, Q4_0KeepsNormsF32AndTheOutputQ8_0) {
  const auto plan = plan_llama_gguf(tiny_weights(true), tiny_config(), *find_gguf_out_type("q4_0"));
  ASSERT_EQ(plan.size(), 12u);
  EXPECT_EQ(plan.front().name, "token_embd.weight");
  EXPECT_EQ(plan.back().name, "output.weight");
  EXPECT_EQ(find(plan, "output.weight").type, gguf::TensorType::Q8_0);
  EXPECT_EQ(find(plan, "token_embd.weight").type, gguf::TensorType::Q4_0);
  EXPECT_EQ(find(plan, "blk.0.attn_norm.weight").type, gguf::TensorType::F32);
  EXPECT_EQ(find(plan, "blk.0.attn_q.weight").permute_heads, 4);
  EXPECT_EQ(find(plan, "blk.0.attn_k.weight").permute_heads, 2);
  EXPECT_EQ(find(plan, "blk.0.attn_v.weight").permute_heads, 0);
  EXPECT_EQ(find(plan, "blk.0.ffn_down.weight").type, gguf::TensorType::Q4_0);
}

TEST(GgufLlamaMap, TiedEmbeddingIsTheOutputAndNoOutputTensor) {
  const auto plan =
      plan_llama_gguf(tiny_weights(false), tiny_config(), *find_gguf_out_type("q4_1"));
  ASSERT_EQ(plan.size(), 11u);
  for (const auto& p : plan) EXPECT_NE(p.name, "output.weight");
  EXPECT_EQ(find(plan, "token_embd.weight").type, gguf::TensorType::Q8_0);
  EXPECT_EQ(find(plan, "blk.0.ffn_up.weight").type, gguf::TensorType::Q4_1);
}

TEST(GgufLlamaMap, ShapeThatDisagreesWithConfigNamesTheTensor) {
  HfConfig c = tiny_config();
  c.intermediate_size = 128;
  try {
    plan_llama_gguf(tiny_weights(true), c, *find_gguf_out_type("q8_0"));
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), ErrorCategory::InvalidInput);
    EXPECT_NE(std::string(e.what()).find("model.layers.0.mlp.gate_proj.weight"), std::string::npos)
        << e.what();
  }
}

TEST(GgufLlamaMap, UnknownTensorIsRefusedByName) {
  Graph g = tiny_weights(true);
  g.set_initializer("model.layers.0.extra.weight", Tensor(DType::F32, {4}));
  try {
    plan_llama_gguf(g, tiny_config(), *find_gguf_out_type("f16"));
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.layers.0.extra.weight"), std::string::npos);
  }
}

TEST(GgufLlamaMap, OtherArchitecturesAreRefusedByName) {
  HfConfig c = tiny_config();
  c.architectures = {"Phi3ForCausalLM"};
  try {
    gguf_architecture(c);
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), ErrorCategory::Unsupported);
    EXPECT_NE(std::string(e.what()).find("Phi3ForCausalLM"), std::string::npos);
  }
  c.architectures = {"MistralForCausalLM"};
  EXPECT_EQ(gguf_architecture(c), "llama");
  c.architectures = {"Qwen2ForCausalLM"};
  EXPECT_EQ(gguf_architecture(c), "qwen2");
}

TEST(GgufLlamaMap, Qwen3KeepsRowOrderAndMapsQkNorms) {
  HfConfig c = tiny_config();
  c.architectures = {"Qwen3ForCausalLM"};
  Graph g = tiny_weights(false);
  g.set_initializer("model.layers.0.self_attn.q_norm.weight", Tensor(DType::F32, {16}));
  g.set_initializer("model.layers.0.self_attn.k_norm.weight", Tensor(DType::F32, {16}));
  const auto plan = plan_llama_gguf(g, c, *find_gguf_out_type("q8_0"));
  EXPECT_EQ(find(plan, "blk.0.attn_q.weight").permute_heads, 0);
  EXPECT_EQ(find(plan, "blk.0.attn_k.weight").permute_heads, 0);
  EXPECT_EQ(find(plan, "blk.0.attn_q_norm.weight").type, gguf::TensorType::F32);
  EXPECT_EQ(find(plan, "blk.0.attn_k_norm.weight").source,
            "model.layers.0.self_attn.k_norm.weight");
  // the same norms in a Llama checkpoint have no llama.cpp counterpart
  c.architectures = {"LlamaForCausalLM"};
  EXPECT_THROW(plan_llama_gguf(g, c, *find_gguf_out_type("q8_0")), Error);
}
