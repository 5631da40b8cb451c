#pragma once
// Raising a graph's default-domain opset when a pass emits ops that need a newer one, with
// the existing nodes rewritten so they mean the same thing at the new version.
#include <cstdint>
#include <optional>
#include <string>

#include "ir/graph.h"

namespace qforge {

// Sets the default-domain ("" or its alias "ai.onnx", whichever the model used) opset to
// `needed` (at most 21) when it is lower; never lowers it. Every node whose schema changed in
// between is rewritten to the new form, subgraphs (If/Loop/Scan bodies) included: attributes
// that became inputs (Reduce*'s, Squeeze's, Unsqueeze's axes, Split's split, Clip's min/max,
// Pad's pads and value, Slice's starts/ends/axes, TopK's k, Dropout's ratio) become int64 or
// scalar initializers; Split gets num_outputs at 18; Softmax/LogSoftmax/Hardmax below 13 keep
// their "flatten at axis" meaning (explicit axis when it is provably the last one, else
// Flatten -> op -> Reshape); Scatter becomes ScatterElements. Throws Error(Unsupported) naming
// node and op for what cannot be converted (Upsample, Resize below 11, ...), leaving the graph
// untouched. Returns a one-line summary (none when nothing changed) for the pass report.
std::optional<std::string> upgrade_default_opset(Graph& graph, int64_t needed,
                                                 const std::string& why);

// The old name; same behaviour.
inline std::optional<std::string> raise_default_opset(Graph& graph, int64_t needed,
                                                      const std::string& why) {
  return upgrade_default_opset(graph, needed, why);
}

}  // namespace qforge
