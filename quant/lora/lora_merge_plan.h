#pragma once
// The checked plan of a LoRA merge: which initializer each adapter tensor lands on, in which
// orientation, with which scale. Built without touching the graph, so a failed check leaves
// the base as it was.
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "quant/lora/lora_merge.h"

namespace qforge {

struct MergeStep {
  const LoraModule* module = nullptr;            // LoRA factors, or null for a replacement
  const LoraReplacement* replacement = nullptr;  // a whole tensor
  bool bias = false;                             // adds module->bias * scale into a bias tensor
  bool transposed = false;  // stored as [in, out] relative to PEFT's canonical [out, in]
  float scale = 1.0f;       // the module's scaling times the adapter's weight
};

struct MergeTarget {
  std::string initializer;
  std::vector<MergeStep> steps;  // in adapter order
};

struct MergePlan {
  std::vector<MergeTarget> targets;
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();  // one per module / replacement
  std::vector<std::string> unmatched;  // adapter keys, "<adapter>: <key>"
};

// Binds and checks every adapter tensor; throws on contradictions (see merge_lora), collects
// unmatched keys with a warning each.
MergePlan plan_lora_merge(const Graph& base, const std::vector<WeightedAdapter>& adapters,
                          const LoraMergeOptions& options, PassReport& report);

}  // namespace qforge
