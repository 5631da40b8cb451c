#pragma once
// Reads a LoRA adapter into memory (the data types are in ir/lora_adapter.h).
// Two formats: a PEFT folder (adapter_config.json + adapter_model.safetensors or .bin) and a
// single Kohya file (.safetensors with lora_down / lora_up / alpha keys).
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "importers/lora/lora_config.h"
#include "ir/lora_adapter.h"
#include "ir/graph.h"
#include "ir/tensor.h"

namespace qforge {

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
