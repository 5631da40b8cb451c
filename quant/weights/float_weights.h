#pragma once
// What a weight-quantizing pass (weight_int8, w4a16) does with the float weights it replaced:
// each goes once nothing reads it any more. Readers that were not rewritten (other ops,
// excluded nodes, graph outputs, If/Loop/Scan bodies) keep it, with a warning.
#include <span>
#include <string>
#include <string_view>

#include "ir/graph.h"
#include "ir/pass.h"

namespace qforge {

// `weights[i]` is the weight behind row i of report.stats["tensors"] (a weight may appear in
// several rows). Sets each row's "float_kept" and the report's "bytes_before" (each float weight
// once) and "bytes_after" (every row's quantized bytes, plus the float ones kept); `form` names
// the quantized copy in the warning ("int8", "int4").
void drop_unused_float_weights(Graph& graph, std::span<const std::string> weights,
                               std::string_view form, PassReport& report);

}  // namespace qforge
