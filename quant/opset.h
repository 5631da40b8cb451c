#pragma once
// Raising a graph's default-domain opset when a pass emits ops that need a newer one.
#include <cstdint>
#include <optional>
#include <string>

#include "ir/graph.h"

namespace qforge {

// Sets the default-domain ("" or its alias "ai.onnx", whichever the model used) opset to
// `needed` when it is lower; never lowers it. Existing ops are not converted, so the returned
// warning (none when nothing changed) names those present whose meaning changed in between
// (Softmax's axis at 13, Squeeze's axes becoming an input at 13, ...). `why` says which new op
// needs the version, for that warning.
std::optional<std::string> raise_default_opset(Graph& graph, int64_t needed,
                                               const std::string& why);

}  // namespace qforge
