#pragma once
// Which nodes static INT8 quantizes and how: the op table (data input, weight input and axis,
// bias input) and the per-node decision, with the reasons for every node left float.
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "ir/graph.h"
#include "ir/pass.h"
#include "quant/static/static_int8.h"

namespace qforge {

// One activation input of a planned node, with its range.
struct PlannedActivation {
  size_t slot = 0;
  std::string name;
  float amax = 0.0f;
};

struct NodePlan {
  size_t node = 0;
  std::vector<PlannedActivation> activations;
  std::optional<size_t> weight_slot;  // set when the node has a constant weight
  std::optional<int64_t> axis;        // weight axis; none: per-tensor
  std::optional<float> weight_amax;   // from an override: one clipped per-tensor scale
  std::optional<size_t> bias_slot;    // a constant float bias [C] (only with int32_bias)
};

// Decides, in node order, which nodes to quantize. Counts and warns into `report` for every node
// of a known op type left float. Throws Usage for an override naming no value of the graph.
std::vector<NodePlan> plan_static_int8(const Graph& graph, const StaticInt8Options& options,
                                       PassReport& report);

// The activations whose calibrated range static INT8 may read on `graph` with `options` (their
// activation_amax aside): those of every node it would quantize if every value had a usable
// range, and every member of the shared-scale groups that could then form. A node or group
// with a range missing, zero or infinite reads fewer, never others, so calibrating only these
// values gives the QDQ graph that calibrating every value gives.
std::set<std::string> static_int8_range_needs(const Graph& graph, StaticInt8Options options);

}  // namespace qforge
