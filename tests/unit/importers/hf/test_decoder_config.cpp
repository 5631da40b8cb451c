// parse_decoder_config: the family figures beyond HfConfig, as transformers 4 and 5 write them
// (legacy keys, rope_scaling vs rope_parameters), each family's defaults for absent keys, and
// the refusals, each naming what it refuses.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "importers/hf/decoder_config.h"
#include "ir/error.h"

using namespace qforge;

namespace {

const std::string kSizes =
    R"("hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
       "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256)";

DecoderConfig parse(const std::string& body) {
  return parse_decoder_config("{" + kSizes + ", " + body + "}", "cfg/config.json");
}

// The error parsing `body` throws: its category, and a message naming the file and `needle`.
ErrorCategory refused(const std::string& body, const std::string& needle) {
  try {
    parse(body);
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("cfg/config.json"), std::string::npos) << what;
    EXPECT_NE(what.find(needle), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    return e.category();
  }
  ADD_FAILURE() << "no error for " << body;
  return ErrorCategory::Internal;
}

TEST(DecoderConfig, LlamaWithTransformers5Keys) {
  const DecoderConfig c = parse(
      R"("model_type": "llama", "rms_norm_eps": 1e-05, "tie_word_embeddings": false,
         "attention_bias": true, "mlp_bias": true, "hidden_act": "silu", "dtype": "bfloat16",
         "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0})");
  EXPECT_EQ(c.family, DecoderFamily::Llama);
  EXPECT_EQ(c.num_layers, 2);
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_EQ(c.intermediate_size, 128);
  EXPECT_EQ(c.num_heads, 4);
  EXPECT_EQ(c.num_kv_heads, 2);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.vocab_size, 256);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_EQ(c.tie_word_embeddings, false);
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_TRUE(c.o_bias);
  EXPECT_TRUE(c.mlp_bias);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_FALSE(c.fused_qkv);
  EXPECT_EQ(c.dtype, "bfloat16");
  EXPECT_DOUBLE_EQ(c.rope_theta, 500000.0);
  EXPECT_EQ(c.rope_scaling, RopeScaling::None);
  EXPECT_EQ(c.rotary_dim, 16);
  EXPECT_FALSE(c.sliding_window);
  EXPECT_FALSE(c.any_sliding());
}

TEST(DecoderConfig, LegacyKeysAndFamilyDefaults) {
  // transformers 4: torch_dtype, a top-level rope_theta, rope_scaling null; no rms_norm_eps,
  // no tie_word_embeddings.
  const DecoderConfig c = parse(
      R"("model_type": "llama", "torch_dtype": "float16", "rope_theta": 1000.0,
         "rope_scaling": null)");
  EXPECT_EQ(c.dtype, "float16");
  EXPECT_DOUBLE_EQ(c.rope_theta, 1000.0);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_FALSE(c.tie_word_embeddings.has_value());  // decided by the folder's tensors
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_FALSE(c.mlp_bias);
  EXPECT_DOUBLE_EQ(parse(R"("model_type": "llama")").rope_theta, 10000.0);
  EXPECT_DOUBLE_EQ(parse(R"("model_type": "phi3")").rms_norm_eps, 1e-5);
}

TEST(DecoderConfig, Llama3RopeScalingLegacyAndNew) {
  const DecoderConfig legacy = parse(
      R"("model_type": "llama", "rope_theta": 500000.0, "max_position_embeddings": 131072,
         "rope_scaling": {"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                          "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})");
  EXPECT_EQ(legacy.rope_scaling, RopeScaling::Llama3);
  EXPECT_DOUBLE_EQ(legacy.rope_factor, 8.0);
  EXPECT_DOUBLE_EQ(legacy.rope_low_freq_factor, 1.0);
  EXPECT_DOUBLE_EQ(legacy.rope_high_freq_factor, 4.0);
  EXPECT_EQ(legacy.rope_original_max_positions, 8192);
  EXPECT_DOUBLE_EQ(legacy.rope_theta, 500000.0);
  const DecoderConfig v5 = parse(
      R"("model_type": "llama", "max_position_embeddings": 64,
         "rope_parameters": {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 4.0,
                             "low_freq_factor": 1.0, "high_freq_factor": 4.0})");
  EXPECT_EQ(v5.rope_scaling, RopeScaling::Llama3);
  EXPECT_EQ(v5.rope_original_max_positions, 64);  // falls back to max_position_embeddings
  // Low frequencies are divided by the factor, high ones kept, medium ones blended.
  const DecoderConfig plain = parse(R"("model_type": "llama", "rope_theta": 10000.0)");
  const std::vector<float> a = plain.rope_inv_freq(), b = v5.rope_inv_freq();
  ASSERT_EQ(a.size(), 8u);
  ASSERT_EQ(b.size(), 8u);
  EXPECT_FLOAT_EQ(a[0], 1.0f);
  EXPECT_FLOAT_EQ(b[0], a[0]);  // wavelength 2 pi < 64 / 4: kept
  EXPECT_FLOAT_EQ(b[7], a[7] / 4.0f);  // wavelength > 64: divided
  const DecoderConfig linear = parse(
      R"("model_type": "llama", "rope_scaling": {"rope_type": "linear", "factor": 2.0})");
  EXPECT_EQ(linear.rope_scaling, RopeScaling::Linear);
  EXPECT_FLOAT_EQ(linear.rope_inv_freq()[3], a[3] / 2.0f);
}

TEST(DecoderConfig, Qwen2HasQkvBiasesOnly) {
  const DecoderConfig c = parse(
      R"("model_type": "qwen2", "use_sliding_window": false, "sliding_window": 4096,
         "max_window_layers": 1)");
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_FALSE(c.o_bias);
  EXPECT_FALSE(c.mlp_bias);
  EXPECT_FALSE(c.sliding_window);  // use_sliding_window false: no window at all
}

TEST(DecoderConfig, Qwen3HeadDimAndQkNorm) {
  const DecoderConfig c = parse(R"("model_type": "qwen3", "head_dim": 32)");
  EXPECT_EQ(c.head_dim, 32);  // not hidden / heads
  EXPECT_EQ(c.rotary_dim, 32);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_EQ(parse(R"("model_type": "qwen3")").head_dim, 128);  // Qwen3Config's default
  EXPECT_EQ(parse(R"("model_type": "llama")").head_dim, 16);
  EXPECT_TRUE(parse(R"("model_type": "qwen3", "attention_bias": true)").o_bias);
}

TEST(DecoderConfig, Phi3FusedAndPartialRotary) {
  const DecoderConfig c = parse(
      R"("model_type": "phi3", "partial_rotary_factor": 0.5,
         "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                             "partial_rotary_factor": 0.5}, "sliding_window": null)");
  EXPECT_TRUE(c.fused_qkv);
  EXPECT_TRUE(c.fused_gate_up);
  EXPECT_EQ(c.rotary_dim, 8);
  EXPECT_EQ(c.rope_inv_freq().size(), 4u);
  EXPECT_FALSE(c.sliding_window);
  EXPECT_TRUE(parse(R"("model_type": "phi3", "sliding_window": 5)").all_sliding());
}

TEST(DecoderConfig, SlidingWindows) {
  // Mistral: every layer, 4096 when the key is absent, none when null.
  EXPECT_EQ(parse(R"("model_type": "mistral")").sliding_window, 4096);
  EXPECT_FALSE(parse(R"("model_type": "mistral", "sliding_window": null)").sliding_window);
  const DecoderConfig m = parse(R"("model_type": "mistral", "sliding_window": 3)");
  EXPECT_EQ(m.sliding_window, 3);
  EXPECT_TRUE(m.all_sliding());
  // Qwen2: layers from max_window_layers on, or as layer_types says.
  const DecoderConfig q = parse(
      R"("model_type": "qwen2", "use_sliding_window": true, "sliding_window": 4,
         "max_window_layers": 1)");
  EXPECT_EQ(q.sliding_window, 4);
  EXPECT_EQ(q.sliding_layers, (std::vector<bool>{false, true}));
  EXPECT_TRUE(q.any_sliding());
  EXPECT_FALSE(q.all_sliding());
  const DecoderConfig t = parse(
      R"("model_type": "qwen3", "use_sliding_window": true, "sliding_window": 4,
         "layer_types": ["sliding_attention", "full_attention"])");
  EXPECT_EQ(t.sliding_layers, (std::vector<bool>{true, false}));
  // Llama has none whatever the file says.
  EXPECT_FALSE(parse(R"("model_type": "llama", "sliding_window": 3)").sliding_window);
}

TEST(DecoderConfig, RefusesOtherFamiliesByName) {
  EXPECT_EQ(refused(R"("model_type": "gpt2")", "model_type 'gpt2'"), ErrorCategory::Unsupported);
  EXPECT_EQ(refused(R"("model_type": "gpt2")", "llama, mistral, qwen2, qwen3, phi3"),
            ErrorCategory::Unsupported);
  EXPECT_EQ(refused(R"("architectures": ["X"])", "model_type"), ErrorCategory::Unsupported);
}

TEST(DecoderConfig, RefusesWhatTheGraphDoesNotBuild) {
  EXPECT_EQ(refused(R"("model_type": "llama", "hidden_act": "gelu")", "'gelu'"),
            ErrorCategory::Unsupported);
  EXPECT_EQ(refused(R"("model_type": "llama", "rope_scaling": {"type": "dynamic", "factor": 2})",
                    "'dynamic'"),
            ErrorCategory::Unsupported);
  EXPECT_EQ(refused(R"("model_type": "llama",
                       "rope_parameters": {"rope_type": "yarn", "factor": 2.0})",
                    "'yarn'"),
            ErrorCategory::Unsupported);
  EXPECT_EQ(refused(R"("model_type": "phi3",
                       "rope_parameters": {"rope_type": "longrope", "short_factor": [1]})",
                    "'longrope'"),
            ErrorCategory::Unsupported);
  EXPECT_EQ(refused(R"("model_type": "llama", "partial_rotary_factor": 0.5)",
                    "partial_rotary_factor"),
            ErrorCategory::Unsupported);
  EXPECT_EQ(refused(R"("model_type": "qwen2", "use_sliding_window": true,
                       "layer_types": ["chunked_attention", "full_attention"])",
                    "'chunked_attention'"),
            ErrorCategory::Unsupported);
  EXPECT_EQ(refused(R"("model_type": "llama",
                       "rope_parameters": {"full_attention": {"rope_type": "default"}})",
                    "per-layer-type"),
            ErrorCategory::Unsupported);
}

TEST(DecoderConfig, RefusesInconsistentFiguresNamingTheKey) {
  EXPECT_EQ(refused(R"("model_type": "llama", "num_key_value_heads": 3)",
                    "num_key_value_heads 3"),
            ErrorCategory::InvalidInput);
  EXPECT_EQ(refused(R"("model_type": "llama", "rms_norm_eps": "small")", "rms_norm_eps"),
            ErrorCategory::InvalidInput);
  EXPECT_EQ(refused(R"("model_type": "llama", "attention_bias": 1)", "attention_bias"),
            ErrorCategory::InvalidInput);
  EXPECT_EQ(refused(R"("model_type": "llama", "rope_scaling": {"type": "llama3", "factor": 8})",
                    "low_freq_factor"),
            ErrorCategory::InvalidInput);
  EXPECT_EQ(refused(R"("model_type": "llama", "rope_scaling": {"type": "linear"})", "factor"),
            ErrorCategory::InvalidInput);
  EXPECT_EQ(refused(R"("model_type": "phi3", "partial_rotary_factor": 0.1)", "rotary dimension"),
            ErrorCategory::InvalidInput);
  EXPECT_EQ(refused(R"("model_type": "mistral", "sliding_window": 0)", "sliding_window"),
            ErrorCategory::InvalidInput);
  EXPECT_EQ(refused(R"("model_type": "qwen2", "use_sliding_window": true,
                       "layer_types": ["full_attention"])",
                    "layer_types"),
            ErrorCategory::InvalidInput);
  try {
    parse_decoder_config(R"({"model_type": "llama", "hidden_size": 64})", "cfg/config.json");
    ADD_FAILURE() << "no error for a config without sizes";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("num_hidden_layers"), std::string::npos) << e.what();
  }
}

}  // namespace
