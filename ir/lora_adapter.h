#pragma once
// LoRA adapter data, as passes see it: one entry per adapted module with its low-rank factors
// and scaling, plus the tensors the adapter replaces outright (modules_to_save, trained biases),
// and PEFT's adapter_config.json values. The loaders (PEFT folders, Kohya files) live in
// importers/lora/; the merge pass (quant/lora/) reads only these types.
#include <cstdint>
#include <filesystem>
#include <regex>
#include <string>
#include <string_view>
#include <vector>

#include "ir/tensor.h"

namespace qforge {

// A rank_pattern / alpha_pattern entry. PEFT matches the key as a regular expression against the
// module's full name: re.match(rf"(.*\.)?({key})$", name); the first key in file order wins.
template <typename V>
struct LoraPattern {
  std::string key;
  std::regex regex;  // "(.*\.)?(key)", matched against the whole name
  V value;
};

struct LoraConfig {
  int64_t r = 8;
  double lora_alpha = 8.0;
  bool use_rslora = false;
  bool fan_in_fan_out = false;
  bool use_dora = false;
  bool lora_bias = false;
  std::string bias = "none";  // "none", "all", "lora_only": which base biases the adapter saved
  std::vector<LoraPattern<int64_t>> rank_pattern;
  std::vector<LoraPattern<double>> alpha_pattern;
  std::vector<std::string> modules_to_save;
  std::vector<std::string> target_modules;  // list form
  std::string target_modules_regex;         // string form
  std::string init_lora_weights = "true";   // as text: true, false, gaussian, eva, ...
  std::string base_model_name_or_path;
};

enum class LoraFormat { Peft, Kohya };

// What kind of layer the factors adapt, read from the keys and the factors' rank:
// Linear (lora_A [r, in], lora_B [out, r]), Conv (lora_A [r, in, k...], lora_B [out, r, 1...]),
// Embedding (lora_embedding_A [r, num_embeddings], lora_embedding_B [embedding_dim, r]).
enum class LoraLayerKind { Linear, Conv, Embedding };
std::string_view lora_layer_kind_name(LoraLayerKind kind);

struct LoraModule {
  std::string name;  // module path in the base model ("model.layers.0.self_attn.q_proj"); for
                     // Kohya the flattened name ("lora_unet_down_blocks_0_..._proj_in")
  LoraLayerKind kind = LoraLayerKind::Linear;
  Tensor a;          // lora_A / lora_embedding_A / lora_down
  Tensor b;          // lora_B / lora_embedding_B / lora_up
  Tensor bias;       // lora_B.bias (lora_bias=True); empty if none
  Tensor magnitude;  // DoRA lora_magnitude_vector; empty if none
  int64_t r = 0;
  double alpha = 0.0;
  double scaling = 0.0;
  std::string r_from;  // "r", "rank_pattern['q_proj']", "lora_down rows"
  std::string
      alpha_from;  // "lora_alpha", "alpha_pattern['o_proj']", "<name>.alpha", "r (no alpha key)"
  std::vector<std::string> keys;  // the adapter keys this module was built from

  int64_t out_features() const { return b.shape()[0]; }
  int64_t in_features() const;  // product of lora_A's dims after the first
};

// A tensor the adapter carries whole: it replaces the base tensor `target` (a PyTorch name).
struct LoraReplacement {
  std::string target;  // "classifier.weight", "model.embed_tokens.weight"
  std::string key;     // the adapter key it came from
  Tensor tensor;
};

struct LoraAdapter {
  std::string name;  // folder or file stem, for reports
  std::filesystem::path source;
  LoraFormat format = LoraFormat::Peft;
  LoraConfig config;  // defaults for Kohya
  std::vector<LoraModule> modules;
  std::vector<LoraReplacement> replacements;
};

}  // namespace qforge
