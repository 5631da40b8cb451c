#pragma once
// A LoRA adapter read into memory: one entry per adapted module with its low-rank factors and
// scaling, plus the tensors the adapter replaces outright (modules_to_save, trained biases).
// Two formats: a PEFT folder (adapter_config.json + adapter_model.safetensors or .bin) and a
// single Kohya file (.safetensors with lora_down / lora_up / alpha keys).
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "importers/lora/lora_config.h"
#include "ir/graph.h"
#include "ir/tensor.h"

namespace qforge {

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

// Reads a PEFT folder (or its adapter_config.json, or its adapter_model file) or a Kohya
// .safetensors file. Throws IO for missing files, InvalidInput for malformed ones, Unsupported
// (with the reason) for adapters whose merge qforge cannot reproduce.
LoraAdapter load_lora_adapter(const std::filesystem::path& path);

// Builds a PEFT adapter from its parsed config and its weights (a weights-only Graph keyed as in
// adapter_model.*). Keys may carry the "base_model.model." prefix and an adapter name
// (".lora_A.default.weight"). `where` names the weights file in messages.
LoraAdapter build_peft_adapter(const LoraConfig& config, const Graph& weights,
                               const std::string& where);

// Builds a Kohya adapter: "<name>.lora_down.weight", "<name>.lora_up.weight", "<name>.alpha".
LoraAdapter build_kohya_adapter(const Graph& weights, const std::string& where);

// True when the weights look like a Kohya file (some key ends in ".lora_down.weight").
bool is_kohya_weights(const Graph& weights);

// "path" or "path:0.7": an adapter and the weight its delta is multiplied by. The weight is the
// text after the last ':' when it parses whole as a finite number; otherwise 1 and all is path.
struct AdapterSpec {
  std::filesystem::path path;
  double weight = 1.0;
};
AdapterSpec parse_adapter_spec(std::string_view spec);

}  // namespace qforge
