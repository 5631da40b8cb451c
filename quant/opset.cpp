#include "quant/opset.h"

#include <set>
#include <string_view>
#include <utility>

namespace qforge {

namespace {

// Ops whose inputs or attributes changed meaning, with the opset that changed them; only the
// versions up to 13 that qforge's passes raise to so far.
constexpr std::pair<std::string_view, int64_t> kOpsetSensitiveOps[] = {
    {"Slice", 10},  {"TopK", 10},    {"Upsample", 10},  {"Clip", 11},       {"Pad", 11},
    {"Resize", 11}, {"Dropout", 12}, {"Softmax", 13},   {"LogSoftmax", 13}, {"Hardmax", 13},
    {"Split", 13},  {"Squeeze", 13}, {"Unsqueeze", 13}, {"ReduceSum", 13},
};

}  // namespace

std::optional<std::string> raise_default_opset(Graph& graph, int64_t needed,
                                               const std::string& why) {
  const int64_t current = graph.opset("");
  if (current >= needed) return std::nullopt;
  std::set<std::string> at_risk;
  for (const Node& node : graph.nodes) {
    if (!node.domain.empty() && node.domain != "ai.onnx") continue;
    for (const auto& [op, since] : kOpsetSensitiveOps) {
      if (node.op_type == op && current < since && since <= needed) at_risk.insert(node.op_type);
    }
  }
  const bool alias =
      graph.opset_imports.count("") == 0 && graph.opset_imports.count("ai.onnx") != 0;
  graph.set_opset(alias ? "ai.onnx" : "", needed);
  std::string message = "raised the default-domain opset from " + std::to_string(current) + " to " +
                        std::to_string(needed) + " for " + why;
  if (!at_risk.empty()) {
    message += "; these ops changed meaning in between and were not converted:";
    for (const std::string& op : at_risk) message += " " + op;
    message += " (re-export the model at opset " + std::to_string(needed) + " to be safe)";
  }
  return message;
}

}  // namespace qforge
