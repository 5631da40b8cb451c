#pragma once
// How far a dequantized tensor is from the original, for pass reports.
#include <optional>
#include <span>

namespace qforge {

struct QuantError {
  double max_abs = 0.0;           // max |original - dequantized|
  std::optional<double> sqnr_db;  // 10 log10(sum original^2 / sum error^2); none when error is 0
};

// Sums run in double over fixed blocks combined in order, so the result does not depend on the
// thread count. Sizes must match (Error(Internal) otherwise).
QuantError measure_quant_error(std::span<const float> original, std::span<const float> dequantized);

}  // namespace qforge
