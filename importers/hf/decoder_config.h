#pragma once
// The figures of a model folder's config.json that building the decoder graph needs, beyond the
// sizes HfConfig holds: the family (model_type), RMSNorm's epsilon, RoPE (theta, scaling, the
// rotated fraction of a head), which Linears carry biases, Qwen3's q/k norms, Phi-3's fused
// projections and the sliding window. Read the way transformers reads them, legacy keys
// included (torch_dtype, a top-level rope_theta, rope_scaling with "type"), each key that a
// file leaves out taking the family's own default (Phi-3's rms_norm_eps is 1e-5, Qwen3's
// head_dim 128, Mistral's sliding_window 4096, ...).
//
// What the graph cannot reproduce is refused by name, never approximated: another model_type
// (naming the families supported), a hidden_act other than silu, a RoPE scaling other than
// linear or llama3 (dynamic, yarn, longrope, ...), a partial rotary factor outside Phi-3.
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace qforge {

enum class DecoderFamily { Llama, Mistral, Qwen2, Qwen3, Phi3 };

// "llama", "mistral", "qwen2", "qwen3", "phi3": the model_type each family has in config.json.
std::string_view decoder_family_name(DecoderFamily family);
// "llama, mistral, qwen2, qwen3, phi3", for messages.
std::string supported_decoder_families();
// The family whose model_type is `model_type`, or nullopt.
std::optional<DecoderFamily> decoder_family(std::string_view model_type);

enum class RopeScaling { None, Linear, Llama3 };

struct DecoderConfig {
  DecoderFamily family = DecoderFamily::Llama;
  std::string model_type;
  int64_t num_layers = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t vocab_size = 0;
  double rms_norm_eps = 1e-6;
  // Absent from config.json: nullopt (the builder then ties when the folder holds no
  // lm_head.weight, as save_pretrained leaves it out of a tied model).
  std::optional<bool> tie_word_embeddings;
  std::string dtype;  // as config.json says ("bfloat16"); may be empty

  // RoPE. inv_freq[i] = 1 / theta^(2i / rotary_dim), i < rotary_dim / 2, then scaled.
  double rope_theta = 10000.0;
  int64_t rotary_dim = 0;  // head_dim * partial_rotary_factor: the leading channels rotated
  RopeScaling rope_scaling = RopeScaling::None;
  double rope_factor = 1.0;                  // Linear and Llama3
  double rope_low_freq_factor = 1.0;         // Llama3
  double rope_high_freq_factor = 4.0;        // Llama3
  int64_t rope_original_max_positions = 0;   // Llama3

  // Linears.
  bool qkv_bias = false;        // q/k/v_proj (or Phi-3's qkv_proj) read a bias
  bool o_bias = false;          // o_proj reads a bias
  bool mlp_bias = false;        // gate/up/down_proj read biases (Llama's mlp_bias)
  bool qk_norm = false;         // Qwen3: RMSNorm of each q and k head (q_norm, k_norm)
  bool fused_qkv = false;       // Phi-3: qkv_proj = [q; k; v]
  bool fused_gate_up = false;   // Phi-3: gate_up_proj = [gate; up]

  // Sliding-window attention: layer i attends to keys j with i - window < j <= i when
  // sliding_layers[i] (transformers' sliding_window_overlay). Empty window: no layer slides.
  std::optional<int64_t> sliding_window;
  std::vector<bool> sliding_layers;  // num_layers entries

  // Not from config.json; set by the caller. A quantized Linear's float weight is q * scale
  // rounded to the scale's dtype (compressed-tensors, GPTQ, AWQ, ModelOpt: what their loaders
  // compute), or kept in f32 when this is set: a GGUF file, whose Q4_0/Q8_0 blocks llama.cpp
  // dequantizes in f32 from the fp16 d.
  bool dequantize_in_f32 = false;

  [[nodiscard]] bool any_sliding() const;
  [[nodiscard]] bool all_sliding() const;
  // The RoPE inverse frequencies, rotary_dim / 2 of them, computed in double and rounded to
  // float as transformers' float32 computation does.
  [[nodiscard]] std::vector<float> rope_inv_freq() const;
};

// Parses config.json text (`file` names it in errors). InvalidInput for text that is not a
// JSON object, a key of the wrong type, a missing size (naming the key) or sizes that do not
// fit together (heads not a multiple of kv heads, an odd rotary dimension); Unsupported for the
// refusals listed above, each naming the value and what is supported.
DecoderConfig parse_decoder_config(const std::string& text, const std::string& file);

// Reads DIR/config.json (IO error naming it when missing or unreadable) and parses it.
DecoderConfig read_decoder_config(const std::filesystem::path& dir);

}  // namespace qforge
