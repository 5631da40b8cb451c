#pragma once
// How far an approximation of a tensor (dequantized weights, a quantized model's activations) is
// from the original: SQNR, cosine and max abs error, for pass reports, `compare` and any
// accuracy budget. Every figure is a number or +-inf, never NaN, so rows sort in one order.
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

namespace qforge {

// Running sums over every element seen, in double. Elements where both sides hold the same
// non-finite value (NaN and NaN, +inf and +inf: an additive mask both models carry) agree and
// count nowhere; an element where only one side is non-finite, or the two differ, is a
// non-finite mismatch, which makes the comparison the worst possible.
struct ErrorSums {
  double signal = 0.0;   // sum original^2
  double noise = 0.0;    // sum (original - approx)^2
  double dot = 0.0;      // sum original * approx
  double approx2 = 0.0;  // sum approx^2
  double max_abs = 0.0;  // max |original - approx|; +inf after a non-finite mismatch
  int64_t nonfinite_mismatches = 0;

  // Sizes must match (Error(Internal) otherwise).
  void add(std::span<const float> original, std::span<const float> approx);
  // Adds another run's sums (the caller fixes the order, so results do not depend on threads).
  void merge(const ErrorSums& other);

  // 10 log10(signal / noise). +inf when the error is 0 (identical tensors, all-zero ones
  // included); -inf when the original is all zero and the approximation is not, or on a
  // non-finite mismatch.
  [[nodiscard]] double sqnr_db() const;
  // dot / sqrt(signal * approx2): exactly 1 when the two are identical (all zero included), 0
  // when only one is all zero or on a non-finite mismatch.
  [[nodiscard]] double cosine() const;
  [[nodiscard]] bool exact() const { return noise == 0.0 && nonfinite_mismatches == 0; }
};

struct QuantError {
  double max_abs = 0.0;  // max |original - dequantized|
  // As ErrorSums::sqnr_db: +inf when the dequantized tensor is exact.
  double sqnr_db = std::numeric_limits<double>::infinity();
};

// "exact" for +inf, "-inf dB", or the figure with one decimal ("31.5 dB"): log lines and text.
std::string sqnr_text(double sqnr_db);

// Sums run in double over fixed blocks combined in order, so the result does not depend on the
// thread count. Sizes must match (Error(Internal) otherwise).
QuantError measure_quant_error(std::span<const float> original, std::span<const float> dequantized);

// One value's comparison, as the worst-first lists rank it.
struct LayerErrorRow {
  std::string name;
  double sqnr_db = std::numeric_limits<double>::infinity();
  double cosine = 1.0;
};

// True when `a` ranks before `b` worst first: lower SQNR (-inf first, exact +inf last), then
// lower cosine, then name, so equal figures list in the same order on every run.
bool ranks_worse(const LayerErrorRow& a, const LayerErrorRow& b);

}  // namespace qforge
