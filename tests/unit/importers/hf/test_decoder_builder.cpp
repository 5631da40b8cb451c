// build_decoder_parts on tiny random weights: the parts run one after another give the whole
// graph's logits; left padding leaves the real tokens' logits as they are unpadded; every
// Linear is a Gemm (transB) reading the folder's tensor by name, found by the W4A16 planner;
// side values and the refusals of missing or misshapen tensors. Agreement with transformers
// itself is tests/interop/test_hf_decoder.py.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>

#include "importers/hf/decoder_builder.h"
#include "ir/error.h"
#include "ir/quantized_linear.h"
#include "quant/w4a16/w4a16.h"
#include "runtime/executor.h"

using namespace qforge;

namespace {

const std::string kSizes =
    R"("hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
       "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 50)";

DecoderConfig config(const std::string& body) {
  return parse_decoder_config("{" + kSizes + ", " + body + "}", "config.json");
}

Tensor random_tensor(Shape shape, uint32_t seed, DType dtype, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(shape_numel(shape));
  for (float& x : v) x = dist(rng);
  return Tensor::from_f32(v, std::move(shape), dtype);
}

// The tensors a folder of `c` holds, random (norm weights around 1).
Graph random_weights(const DecoderConfig& c, DType dtype = DType::F32, bool lm_head = true) {
  Graph g;
  uint32_t seed = 1;
  auto add = [&](const std::string& name, Shape shape, bool norm = false) {
    Tensor t = random_tensor(shape, seed++, DType::F32, norm ? 0.1f : 0.2f);
    if (norm) {
      std::vector<float> v = t.to_f32();
      for (float& x : v) x += 1.0f;
      t = Tensor::from_f32(v, shape);
    }
    g.set_initializer(name, Tensor::from_f32(t.to_f32(), shape, dtype));
  };
  const int64_t h = c.hidden_size, d = c.head_dim, in = c.intermediate_size;
  const int64_t q = c.num_heads * d, kv = c.num_kv_heads * d;
  add("model.embed_tokens.weight", {c.vocab_size, h});
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    add(p + "input_layernorm.weight", {h}, true);
    add(p + "post_attention_layernorm.weight", {h}, true);
    if (c.fused_qkv) {
      add(p + "self_attn.qkv_proj.weight", {q + 2 * kv, h});
    } else {
      add(p + "self_attn.q_proj.weight", {q, h});
      add(p + "self_attn.k_proj.weight", {kv, h});
      add(p + "self_attn.v_proj.weight", {kv, h});
      if (c.qkv_bias) {
        add(p + "self_attn.q_proj.bias", {q});
        add(p + "self_attn.k_proj.bias", {kv});
        add(p + "self_attn.v_proj.bias", {kv});
      }
    }
    if (c.qk_norm) {
      add(p + "self_attn.q_norm.weight", {d}, true);
      add(p + "self_attn.k_norm.weight", {d}, true);
    }
    add(p + "self_attn.o_proj.weight", {h, q});
    if (c.fused_gate_up) {
      add(p + "mlp.gate_up_proj.weight", {2 * in, h});
    } else {
      add(p + "mlp.gate_proj.weight", {in, h});
      add(p + "mlp.up_proj.weight", {in, h});
    }
    add(p + "mlp.down_proj.weight", {h, in});
  }
  add("model.norm.weight", {h}, true);
  if (lm_head) add("lm_head.weight", {c.vocab_size, h});
  return g;
}

Tensor i64(Shape shape, const std::vector<int64_t>& v) {
  Tensor t(DType::I64, std::move(shape));
  std::copy(v.begin(), v.end(), t.mutable_data<int64_t>().begin());
  return t;
}

using Feeds = std::vector<std::pair<std::string, Tensor>>;

// Two rows of 7: the first left-padded by 3, the second full.
const std::vector<int64_t> kIds = {0, 0, 0, 5, 17, 3, 44, 9, 1, 30, 2, 8, 49, 21};
const std::vector<int64_t> kMask = {0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};

Feeds token_feeds() {
  return {{"input_ids", i64({2, 7}, kIds)}, {"attention_mask", i64({2, 7}, kMask)}};
}

Tensor run_whole(const DecoderParts& parts, const Feeds& feeds) {
  const Graph g = parts.whole();
  g.check();
  return Executor(g).run(feeds).at(0);
}

Tensor run_in_parts(const DecoderParts& parts, const Feeds& feeds) {
  const Graph pro = parts.prologue();
  pro.check();
  const std::vector<Tensor> side = Executor(pro).run(feeds);
  const std::vector<std::string> names = parts.side_values();
  EXPECT_EQ(side.size(), names.size() + 1);
  Tensor hidden = side.at(0);
  for (int64_t i = 0; i < parts.num_layers(); ++i) {
    const Graph layer = parts.layer(i);
    layer.check();
    Feeds in = {{"hidden_states", hidden}};
    for (size_t k = 0; k < names.size(); ++k) in.emplace_back(names[k], side.at(k + 1));
    hidden = Executor(layer).run(in).at(0);
  }
  const Graph epi = parts.epilogue();
  epi.check();
  return Executor(epi).run({{"hidden_states", hidden}}).at(0);
}

float max_abs_diff(std::span<const float> a, std::span<const float> b) {
  float m = 0.0f;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

const char* const kFamilies[] = {
    R"("model_type": "llama", "tie_word_embeddings": false)",
    R"("model_type": "llama", "tie_word_embeddings": true, "rope_scaling": {"rope_type":
       "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
       "original_max_position_embeddings": 16})",
    R"("model_type": "mistral", "sliding_window": 3)",
    R"("model_type": "qwen2", "use_sliding_window": true, "sliding_window": 2,
       "max_window_layers": 1)",
    R"("model_type": "qwen3", "head_dim": 16)",
    R"("model_type": "phi3", "partial_rotary_factor": 0.5)",
};

TEST(DecoderBuilder, PartsInTurnGiveTheWholeGraphsLogits) {
  for (const char* body : kFamilies) {
    SCOPED_TRACE(body);
    const DecoderConfig c = config(body);
    const auto parts = build_decoder_parts(c, random_weights(c));
    const Tensor whole = run_whole(*parts, token_feeds());
    EXPECT_EQ(whole.shape(), (Shape{2, 7, 50}));
    const Tensor split = run_in_parts(*parts, token_feeds());
    ASSERT_EQ(split.shape(), whole.shape());
    EXPECT_EQ(max_abs_diff(whole.data<float>(), split.data<float>()), 0.0f);
    for (float v : whole.data<float>()) ASSERT_TRUE(std::isfinite(v));
  }
}

TEST(DecoderBuilder, LeftPaddingKeepsTheRealTokensLogits) {
  for (const char* body : kFamilies) {
    SCOPED_TRACE(body);
    const DecoderConfig c = config(body);
    const auto parts = build_decoder_parts(c, random_weights(c));
    const Tensor padded = run_whole(*parts, token_feeds());
    const Tensor alone = run_whole(*parts, {{"input_ids", i64({1, 4}, {5, 17, 3, 44})},
                                            {"attention_mask", i64({1, 4}, {1, 1, 1, 1})}});
    const auto p = padded.data<float>(), a = alone.data<float>();
    // Row 0's positions 3..6 are the unpadded row's 0..3.
    EXPECT_LT(max_abs_diff(p.subspan(3 * 50, 4 * 50), a), 1e-5f);
    // Right padding: the real prefix is unchanged too (the causal mask hides what follows).
    const Tensor right = run_whole(*parts, {{"input_ids", i64({1, 6}, {5, 17, 3, 44, 0, 0})},
                                            {"attention_mask", i64({1, 6}, {1, 1, 1, 1, 0, 0})}});
    EXPECT_LT(max_abs_diff(right.data<float>().subspan(0, 4 * 50), a), 1e-5f);
  }
}

TEST(DecoderBuilder, MaskedTokensAreNotAttended) {
  // The same ids with one middle token masked out: the tokens after it change.
  const DecoderConfig c = config(kFamilies[0]);
  const auto parts = build_decoder_parts(c, random_weights(c));
  const std::vector<int64_t> ids = {5, 17, 3, 44};
  const Tensor all = run_whole(*parts, {{"input_ids", i64({1, 4}, ids)},
                                        {"attention_mask", i64({1, 4}, {1, 1, 1, 1})}});
  const Tensor hole = run_whole(*parts, {{"input_ids", i64({1, 4}, ids)},
                                         {"attention_mask", i64({1, 4}, {1, 0, 1, 1})}});
  EXPECT_EQ(max_abs_diff(all.data<float>().subspan(0, 50), hole.data<float>().subspan(0, 50)),
            0.0f);
  EXPECT_GT(max_abs_diff(all.data<float>().subspan(150, 50), hole.data<float>().subspan(150, 50)),
            1e-4f);
}

TEST(DecoderBuilder, LinearsAreGemmsOnTheFoldersTensors) {
  for (const char* body : kFamilies) {
    SCOPED_TRACE(body);
    const DecoderConfig c = config(body);
    const Graph weights = random_weights(c);
    const auto parts = build_decoder_parts(c, weights);
    const Graph layer = parts->layer(1);
    const auto producers = layer.producers();
    const std::vector<DecoderLinear> linears = parts->linears(1);
    EXPECT_EQ(linears.size(), c.fused_qkv ? 4u : 7u);
    for (const DecoderLinear& l : linears) {
      SCOPED_TRACE(l.weight);
      EXPECT_EQ(l.weight.rfind("model.layers.1.", 0), 0u);
      const Tensor* w = layer.find_initializer(l.weight);
      ASSERT_NE(w, nullptr);
      EXPECT_EQ(w->dtype(), DType::F32);
      EXPECT_EQ(w->shape(), (Shape{l.out_features, l.in_features}));
      EXPECT_TRUE(w->equals(*weights.find_initializer(l.weight)));
      if (!l.bias.empty()) {
        EXPECT_NE(layer.find_initializer(l.bias), nullptr);
      }
      if (!l.norm.empty()) {
        EXPECT_NE(layer.find_initializer(l.norm), nullptr);
      }
      // The input is a value the layer computes; a Reshape of it feeds the Gemm.
      ASSERT_TRUE(producers.count(l.input)) << l.input;
      const Node* gemm = nullptr;
      for (const Node& n : layer.nodes)
        if (n.op_type == "Gemm" && n.inputs.at(1) == l.weight) gemm = &n;
      ASSERT_NE(gemm, nullptr);
      EXPECT_EQ(gemm->attr_int("transB", 0), 1);
      EXPECT_EQ(gemm->inputs.size(), l.bias.empty() ? 2u : 3u);
      const Node& reshape = layer.nodes.at(producers.at(gemm->inputs[0]));
      EXPECT_EQ(reshape.op_type, "Reshape");
      EXPECT_EQ(reshape.inputs[0], l.input);
    }
    // Rows of the same input share one Reshape: one per group.
    EXPECT_EQ(linears[0].group, "attn_in");
    EXPECT_EQ(linears.back().group, "mlp_out");
    // The W4A16 planner finds every Linear of every layer; lm_head is left float.
    const Graph whole = parts->whole();
    const std::vector<W4A16Target> targets = plan_w4a16_targets(whole, W4A16Options{});
    EXPECT_EQ(targets.size(), linears.size() * 2);
    for (const W4A16Target& t : targets) {
      EXPECT_EQ(t.axis, 1);
      EXPECT_EQ(t.weight.find("lm_head"), std::string::npos);
    }
  }
}

TEST(DecoderBuilder, SideValuesAndTheirShapes) {
  const DecoderConfig llama = config(kFamilies[0]);
  const auto a = build_decoder_parts(llama, random_weights(llama));
  EXPECT_EQ(a->side_values(),
            (std::vector<std::string>{"attention_bias", "rope_cos", "rope_sin"}));
  const std::vector<Tensor> out = Executor(a->prologue()).run(token_feeds());
  ASSERT_EQ(out.size(), 4u);
  EXPECT_EQ(out[0].shape(), (Shape{2, 7, 32}));
  EXPECT_EQ(out[1].shape(), (Shape{2, 1, 7, 7}));
  EXPECT_EQ(out[2].shape(), (Shape{2, 1, 7, 8}));
  EXPECT_EQ(out[3].shape(), (Shape{2, 1, 7, 8}));
  // Row 0, query 5 (a token): keys 3..5 open, pads and the future closed.
  const auto bias = out[1].data<float>();
  for (int64_t j = 0; j < 7; ++j) {
    const float v = bias[static_cast<size_t>(5 * 7 + j)];
    EXPECT_EQ(v == 0.0f, j >= 3 && j <= 5) << j;
  }
  // Per-layer sliding (Qwen2 past max_window_layers): a second bias.
  const DecoderConfig qwen = config(kFamilies[3]);
  const auto q = build_decoder_parts(qwen, random_weights(qwen));
  EXPECT_EQ(q->side_values(), (std::vector<std::string>{"attention_bias",
                                                        "sliding_attention_bias", "rope_cos",
                                                        "rope_sin"}));
  const std::vector<Tensor> qo = Executor(q->prologue()).run(token_feeds());
  const auto full = qo[1].data<float>(), sliding = qo[2].data<float>();
  // Row 1 (no pads), query 6: full sees 0..6, a window of 2 sees 5..6.
  for (int64_t j = 0; j < 7; ++j) {
    EXPECT_EQ(full[static_cast<size_t>(49 + 6 * 7 + j)], 0.0f);
    EXPECT_EQ(sliding[static_cast<size_t>(49 + 6 * 7 + j)] == 0.0f, j >= 5) << j;
  }
}

TEST(DecoderBuilder, HalfWeightsBecomeF32AndF32OnesAreShared) {
  const DecoderConfig c = config(kFamilies[0]);
  const Graph f32 = random_weights(c, DType::F32);
  const auto parts = build_decoder_parts(c, f32);
  const Graph layer = parts->layer(0);
  const std::string q = "model.layers.0.self_attn.q_proj.weight";
  EXPECT_EQ(layer.find_initializer(q)->storage(), f32.find_initializer(q)->storage());
  const Graph bf16 = random_weights(c, DType::BF16);
  const auto half = build_decoder_parts(c, bf16);
  const Graph layer16 = half->layer(0);
  EXPECT_EQ(layer16.find_initializer(q)->dtype(), DType::F32);
  EXPECT_EQ(layer16.find_initializer(q)->to_f32(), bf16.find_initializer(q)->to_f32());
  // A layer holds its own tensors only.
  EXPECT_EQ(layer16.find_initializer("model.layers.1.self_attn.q_proj.weight"), nullptr);
  EXPECT_EQ(layer16.find_initializer("model.embed_tokens.weight"), nullptr);
  for (const Node& n : layer16.nodes) EXPECT_NE(n.op_type, "Cast") << n.name;
}

TEST(DecoderBuilder, QuantizedLinearsAreDequantizedWhenBuilt) {
  const DecoderConfig c = config(kFamilies[0]);
  Graph w = random_weights(c);
  const std::string q = "model.layers.0.self_attn.q_proj.weight";
  const int64_t out = w.find_initializer(q)->shape()[0];
  Tensor values(DType::I4, {out, 32});
  auto bytes = values.mutable_data<uint8_t>();
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 37);
  store_quantized_linear(w, q, values, random_tensor({out, 2}, 9, DType::BF16, 0.05f), 16);
  const Tensor want = dequantize_quantized_linear(w, *w.find_quant_record(q));
  const Graph layer = build_decoder_parts(c, w)->layer(0);
  const Tensor* got = layer.find_initializer(q);
  ASSERT_NE(got, nullptr);
  EXPECT_EQ(got->dtype(), DType::F32);
  EXPECT_EQ(got->to_f32(), want.to_f32());
  EXPECT_EQ(layer.find_initializer(quantized_linear_scale_name(q)), nullptr);
  EXPECT_TRUE(layer.quant_records().empty());
}

TEST(DecoderBuilder, TiedEmbeddingsAsConfigOrFolderSays) {
  const DecoderConfig tied = config(kFamilies[1]);
  const Graph e = build_decoder_parts(tied, random_weights(tied, DType::F32, false))->epilogue();
  EXPECT_NE(e.find_initializer("model.embed_tokens.weight"), nullptr);
  EXPECT_EQ(e.find_initializer("lm_head.weight"), nullptr);
  // No tie_word_embeddings key: tied when the folder has no lm_head.weight.
  const DecoderConfig unsaid = config(R"("model_type": "llama")");
  EXPECT_NE(build_decoder_parts(unsaid, random_weights(unsaid, DType::F32, false))
                ->epilogue()
                .find_initializer("model.embed_tokens.weight"),
            nullptr);
  EXPECT_NE(build_decoder_parts(unsaid, random_weights(unsaid))->epilogue().find_initializer(
                "lm_head.weight"),
            nullptr);
}

TEST(DecoderBuilder, RefusesMissingOrMisshapenTensorsByName) {
  const DecoderConfig c = config(kFamilies[0]);
  auto message = [&](const Graph& w) -> std::string {
    try {
      build_decoder_parts(c, w);
    } catch (const Error& e) {
      EXPECT_EQ(e.category(), ErrorCategory::InvalidInput);
      return e.what();
    }
    ADD_FAILURE() << "no error";
    return "";
  };
  Graph w = random_weights(c);
  w.remove_initializer("model.layers.1.mlp.up_proj.weight");
  EXPECT_NE(message(w).find("'model.layers.1.mlp.up_proj.weight'"), std::string::npos);
  EXPECT_NE(message(random_weights(c, DType::F32, false)).find("'lm_head.weight'"),
            std::string::npos);
  w = random_weights(c);
  w.set_initializer("model.layers.0.self_attn.k_proj.weight",
                    random_tensor({32, 32}, 1, DType::F32, 1.0f));
  const std::string m = message(w);
  EXPECT_NE(m.find("'model.layers.0.self_attn.k_proj.weight'"), std::string::npos) << m;
  EXPECT_NE(m.find("[16, 32]"), std::string::npos) << m;
  EXPECT_THROW(build_decoder_parts(c, random_weights(c))->layer(2), Error);
}

}  // namespace
