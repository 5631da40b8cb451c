#pragma once
// Which input of an op is its weight, which its bias, and the weight's axes (DESIGN.md,
// "Quantization rules"): one table for every pass that quantizes weights. INT8 (weight-only and
// static) quantizes per output channel; W4A16 blocks along the reduction axis.
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

#include "ir/graph.h"

namespace qforge {

struct WeightSlot {
  std::string_view op_type;   // in the ONNX domain
  size_t weight_input;
  std::optional<size_t> bias_input;
  // The output-channel axis of a weight of rank `rank` (INT8's per-channel axis); null where
  // the op has no output channel (Gather's table).
  int64_t (*channel_axis)(const Node& node, int64_t rank);
  // The reduction axis of a 2-D weight (W4A16's block axis); null for convolutions.
  int64_t (*reduction_axis)(const Node& node);
};

// Conv, ConvTranspose, Gemm, MatMul, Gather (an embedding table [vocab, hidden], blocked along
// hidden as a tied lm_head is), in that order.
std::span<const WeightSlot> weight_slots();

// The row for `node`'s op, or null: another op or domain, or a Gather whose axis is not 0.
const WeightSlot* find_weight_slot(const Node& node);

}  // namespace qforge
