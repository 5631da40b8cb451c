#pragma once
// PEFT's adapter_config.json for LoRA, and the per-module rank and alpha it implies.
#include <cstdint>
#include <regex>
#include <string>
#include <string_view>
#include <vector>

#include "ir/lora_adapter.h"

namespace qforge {

// Parses adapter_config.json text. `where` names the file in messages. Throws InvalidInput for
// malformed JSON or values (r <= 0, wrong types, a bad pattern) and Unsupported, with the
// reason, for adapters qforge cannot merge exactly: peft_type other than LORA, initialisations
// that changed the base weights (pissa, olora, loftq, corda, lora_ga), layer_replication,
// and LoRA variants whose merge differs (VeLoRA, aLoRA, BD-LoRA, Arrow, KaSA,
// MonteCLoRA, QALoRA, target_parameters, trainable tokens, Megatron).
LoraConfig parse_lora_config(std::string_view json_text, const std::string& where);

// The rank and alpha PEFT gives the module named `module` (its full name in the base model, e.g.
// "model.layers.0.self_attn.q_proj"), and where each came from ("r", "rank_pattern['q_proj']").
struct ModuleScaling {
  int64_t r = 0;
  double alpha = 0.0;
  double scaling = 0.0;  // alpha / r, or alpha / sqrt(r) with use_rslora
  std::string r_from;
  std::string alpha_from;
};
ModuleScaling resolve_module_scaling(const LoraConfig& config, const std::string& module);

// PEFT's scaling for a rank and alpha.
double lora_scaling(double alpha, int64_t r, bool use_rslora);

}  // namespace qforge
