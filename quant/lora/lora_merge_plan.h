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

// Another initializer that holds the target's weight (tied weights). PEFT merges into the one
// shared tensor, so every alias receives the merged result.
struct TiedCopy {
  std::string initializer;
  bool transposed = false;  // holds the target's transpose (an exporter's copy for a MatMul)
  std::string how;          // "shared storage", "transposed copy", "tie_word_embeddings"
};

struct MergeTarget {
  std::string initializer;
  std::vector<MergeStep> steps;  // replacements first, then adapter order
  std::vector<TiedCopy> tied;    // aliases written with the result
};

struct MergePlan {
  std::vector<MergeTarget> targets;
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();  // one per module / replacement
  std::vector<std::string> unmatched;  // adapter keys, "<adapter>: <key>"
};

// Binds and checks every adapter tensor; throws on contradictions (see merge_lora), collects
// unmatched keys with a warning each. Targets that are aliases of one weight become one target
// with its tied copies: initializers sharing a storage window (a torch.save file's tied
// weights), the names of a recorded tie (ir/tied_weights.h), and in a graph the exact
// transposed copy an exporter made of a tied embedding. A target that overlaps another
// initializer's storage any other way, or a modules_to_save replacement of a tied weight
// (which PEFT unties), throws Unsupported: the merge would lose the tie.
MergePlan plan_lora_merge(const Graph& base, const std::vector<WeightedAdapter>& adapters,
                          const LoraMergeOptions& options, PassReport& report);

}  // namespace qforge
