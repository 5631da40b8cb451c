#include "quant/calib/quant_error.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "ir/error.h"
#include "kernels/cpu/task_pool.h"
#include "kernels/device.h"

namespace qforge {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

void check_sizes(std::span<const float> original, std::span<const float> approx) {
  if (original.size() != approx.size()) {
    fail_internal("quant error: " + std::to_string(original.size()) + " values against " +
                  std::to_string(approx.size()));
  }
}

// Both non-finite and the same (NaN and NaN count as the same).
bool same_nonfinite(double x, double y) {
  return (std::isnan(x) && std::isnan(y)) || (std::isinf(x) && x == y);
}

}  // namespace

void ErrorSums::add(std::span<const float> original, std::span<const float> approx) {
  check_sizes(original, approx);
  for (size_t i = 0; i < original.size(); ++i) {
    const double x = original[i];
    const double y = approx[i];
    if (!std::isfinite(x) || !std::isfinite(y)) {
      if (!same_nonfinite(x, y)) {
        ++nonfinite_mismatches;
        max_abs = kInf;
      }
      continue;
    }
    const double e = x - y;
    signal += x * x;
    noise += e * e;
    dot += x * y;
    approx2 += y * y;
    max_abs = std::max(max_abs, std::fabs(e));
  }
}

void ErrorSums::merge(const ErrorSums& other) {
  signal += other.signal;
  noise += other.noise;
  dot += other.dot;
  approx2 += other.approx2;
  max_abs = std::max(max_abs, other.max_abs);
  nonfinite_mismatches += other.nonfinite_mismatches;
}

double ErrorSums::sqnr_db() const {
  if (nonfinite_mismatches > 0) return -kInf;
  if (noise == 0.0) return kInf;
  if (signal == 0.0) return -kInf;
  // Both sums are finite: a float squared stays below 1.2e77, far from double's limit.
  return 10.0 * std::log10(signal / noise);
}

double ErrorSums::cosine() const {
  if (nonfinite_mismatches > 0) return 0.0;
  if (exact()) return 1.0;  // not 1 - 1 ulp from rounding: identical values rank alike
  if (signal == 0.0 || approx2 == 0.0) return 0.0;
  // Rounding may carry |cos| a hair past 1; clamp so that a gate at 1.0 reads exact agreement.
  return std::clamp(dot / std::sqrt(signal * approx2), -1.0, 1.0);
}

QuantError measure_quant_error(std::span<const float> original,
                               std::span<const float> dequantized) {
  check_sizes(original, dequantized);
  constexpr int64_t kBlock = 65536;
  const auto n = static_cast<int64_t>(original.size());
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  std::vector<ErrorSums> partial(static_cast<size_t>(blocks));
  run_tasks(cpu_threads(), blocks, [&](int64_t b, int) {
    const auto first = static_cast<size_t>(b * kBlock);
    const auto count = static_cast<size_t>(std::min(n, (b + 1) * kBlock)) - first;
    partial[static_cast<size_t>(b)].add(original.subspan(first, count),
                                        dequantized.subspan(first, count));
  });
  ErrorSums total;
  for (const ErrorSums& p : partial) total.merge(p);  // in block order: any thread count
  return {total.max_abs, total.sqnr_db()};
}

namespace {

// A NaN read from elsewhere (a report file) ranks as the worst, keeping the order strict.
double rank_key(double v) { return std::isnan(v) ? -kInf : v; }

}  // namespace

std::string sqnr_text(double sqnr_db) {
  if (sqnr_db == kInf) return "exact";
  if (std::isnan(sqnr_db)) return "nan dB";
  if (std::isinf(sqnr_db)) return "-inf dB";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f dB", sqnr_db);
  return buf;
}

bool ranks_worse(const LayerErrorRow& a, const LayerErrorRow& b) {
  const double sa = rank_key(a.sqnr_db), sb = rank_key(b.sqnr_db);
  if (sa != sb) return sa < sb;
  const double ca = rank_key(a.cosine), cb = rank_key(b.cosine);
  if (ca != cb) return ca < cb;
  return a.name < b.name;
}

}  // namespace qforge
