#pragma once
// Activations that static INT8 gives one scale because a runtime needs them to: TensorRT fuses a
// Concat into the quantized graph only when all its inputs (and so its output) carry one scale
// (StaticInt8Options::concat_shared_scale), and a residual Add whose two inputs share one needs
// no rescale (add_shared_scale). Each group takes the union of its members' ranges: amax = the
// largest member amax.
#include <string>
#include <vector>

#include "ir/calibration_table.h"
#include "ir/graph.h"
#include "quant/static/static_int8.h"

namespace qforge {

struct SharedScaleGroup {
  std::vector<std::string> members;  // activation names, sorted
  float amax = 0.0f;                 // the largest member's range
};

// An activation's range as static INT8 uses it: an --override amax, else the calibrated one;
// none when missing, zero or not finite.
std::optional<float> usable_activation_amax(const StaticInt8Options& options,
                                            const std::string& name);

// Whether static INT8 quantizes `node` (a Concat) with one shared scale: the option is on, the
// op types allow Concat, the node is not excluded, and every input is an activation with a
// usable range (shape arithmetic on integer tensors has none; a constant input leaves it float).
bool concat_shares_scale(const Graph& graph, const Node& node, const StaticInt8Options& options);

// The groups: every input and the output of each Concat that concat_shares_scale(); with
// add_shared_scale, both inputs of each Add that static INT8 quantizes (two activations with
// usable ranges, not excluded). Groups linked by a member merge. Deterministic: groups ordered
// by their first member's name.
std::vector<SharedScaleGroup> shared_scale_groups(const Graph& graph,
                                                  const StaticInt8Options& options);

// The table as the QDQ graph uses it: each group's members take the group's amax, so that a
// bundle's calibration cache gives TensorRT the graph's scales. Returns the ranges changed.
int64_t share_table_ranges(const Graph& graph, const StaticInt8Options& options,
                           CalibrationTable& table);

}  // namespace qforge
