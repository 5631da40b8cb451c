#include "quant/weights/weight_slots.h"

#include <algorithm>
#include <array>

namespace qforge {

namespace {

int64_t gemm_b_transposed(const Node& node) { return node.attr_int("transB", 0) != 0 ? 1 : 0; }

constexpr std::array<WeightSlot, 5> kWeightSlots = {{
    {"Conv", 1, 2, [](const Node&, int64_t) -> int64_t { return 0; }, nullptr},
    {"ConvTranspose", 1, 2, [](const Node&, int64_t) -> int64_t { return 1; }, nullptr},
    // B [K, N], or [N, K] with transB.
    {"Gemm", 1, 2, [](const Node& n, int64_t) -> int64_t { return 1 - gemm_b_transposed(n); },
     [](const Node& n) -> int64_t { return gemm_b_transposed(n); }},
    // B [..., K, N].
    {"MatMul", 1, std::nullopt, [](const Node&, int64_t rank) -> int64_t { return rank - 1; },
     [](const Node&) -> int64_t { return 0; }},
    {"Gather", 0, std::nullopt, nullptr, [](const Node&) -> int64_t { return 1; }},
}};

}  // namespace

std::span<const WeightSlot> weight_slots() { return kWeightSlots; }

const WeightSlot* find_weight_slot(const Node& node) {
  if (!node.domain.empty() && node.domain != "ai.onnx") return nullptr;
  const auto* it = std::find_if(kWeightSlots.begin(), kWeightSlots.end(),
                                [&](const WeightSlot& s) { return s.op_type == node.op_type; });
  if (it == kWeightSlots.end()) return nullptr;
  if (it->op_type == "Gather" && node.attr_int("axis", 0) != 0) return nullptr;
  return it;
}

}  // namespace qforge
