#include "quant/calib/quant_error.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "ir/error.h"
#include "kernels/device.h"

namespace qforge {

QuantError measure_quant_error(std::span<const float> original,
                               std::span<const float> dequantized) {
  if (original.size() != dequantized.size()) {
    fail_internal("measure_quant_error: " + std::to_string(original.size()) + " values against " +
                  std::to_string(dequantized.size()));
  }
  constexpr int64_t kBlock = 65536;
  const auto n = static_cast<int64_t>(original.size());
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  struct Partial {
    double signal = 0.0, noise = 0.0, max_abs = 0.0;
  };
  std::vector<Partial> partial(static_cast<size_t>(blocks));
#pragma omp parallel for num_threads(cpu_threads()) schedule(static) if (blocks > 1)
  for (int64_t b = 0; b < blocks; ++b) {
    Partial p;
    for (int64_t k = b * kBlock; k < std::min(n, (b + 1) * kBlock); ++k) {
      const double x = original[static_cast<size_t>(k)];
      const double e = x - static_cast<double>(dequantized[static_cast<size_t>(k)]);
      p.signal += x * x;
      p.noise += e * e;
      p.max_abs = std::max(p.max_abs, std::fabs(e));
    }
    partial[static_cast<size_t>(b)] = p;
  }
  Partial total;
  for (const Partial& p : partial) {  // in block order: the same sum for any thread count
    total.signal += p.signal;
    total.noise += p.noise;
    total.max_abs = std::max(total.max_abs, p.max_abs);
  }
  QuantError result;
  result.max_abs = total.max_abs;
  if (total.noise > 0.0) result.sqnr_db = 10.0 * std::log10(total.signal / total.noise);
  return result;
}

}  // namespace qforge
