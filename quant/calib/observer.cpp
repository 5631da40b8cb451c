#include "quant/calib/observer.h"

#include <algorithm>
#include <cmath>
#include <cstddef>

#include "kernels/calib.h"

namespace qforge {

namespace {

// Min and max under the kernels' order, where -0.0 < +0.0, so a merge gives what one call over
// all values would.
bool before(float a, float b) { return a < b || (a == b && std::signbit(a) && !std::signbit(b)); }

float abs_max(float min, float max) { return std::fmax(std::fabs(min), std::fabs(max)); }

}  // namespace

float TensorStats::amax() const { return abs_max(min, max); }

ValueRange RangeObserver::observe(const std::string& name, std::span<const float> values) {
  const std::span<const float> one[] = {values};
  return observe(name, FloatPieces(one));
}

ValueRange RangeObserver::observe(const std::string& name, FloatPieces pieces) {
  const ValueRange r = minmax(pieces, device_, &workspace_);
  TensorStats& s = stats_[name];
  if (r.count > 0) {
    if (s.count == 0 || before(r.min, s.min)) s.min = r.min;
    if (s.count == 0 || before(s.max, r.max)) s.max = r.max;
  }
  s.count += r.count;
  s.nan += r.nan;
  return r;
}

int histogram_exponent(float amax, int64_t bins) {
  const auto n = static_cast<double>(bins);
  // bins * 2^e <= amax for this e (2^ilogb(x) <= x < 2^(ilogb(x) + 1)); a step or two up from it.
  int e = amax > 0.0f ? std::ilogb(amax) - std::ilogb(n) - 1 : -127;
  e = std::max(e, -127);
  while (std::ldexp(n, e) <= static_cast<double>(amax)) ++e;
  return e;
}

void HistogramObserver::observe(const std::string& name, std::span<const float> values,
                                const ValueRange& range) {
  const std::span<const float> one[] = {values};
  observe(name, FloatPieces(one), range);
}

void HistogramObserver::observe(const std::string& name, FloatPieces pieces,
                                const ValueRange& range) {
  Entry& entry = entries_[name];
  if (entry.infinite || range.count == 0) return;  // gone, or nothing but NaNs
  const float amax = abs_max(range.min, range.max);
  if (!std::isfinite(amax)) {
    entry = Entry{};
    entry.infinite = true;
    return;
  }
  const int need = histogram_exponent(amax, bins_);
  if (!entry.started) {
    if (amax == 0.0f) {  // zeros: bin 0 at whatever width comes
      entry.zeros += range.count;
      return;
    }
    entry.started = true;
    entry.exponent = need;
    entry.bins.assign(static_cast<size_t>(bins_), 0);
    entry.bins[0] = entry.zeros;
  } else if (need > entry.exponent) {
    // Bin i of width 2^e lies inside bin i >> d of width 2^(e + d): merge in place, in order.
    const int d = need - entry.exponent;
    for (size_t i = 1; i < entry.bins.size(); ++i) {
      const size_t to = d >= 63 ? 0 : i >> d;
      if (to == i) continue;
      entry.bins[to] += entry.bins[i];
      entry.bins[i] = 0;
    }
    entry.exponent = need;
  }
  histogram_abs_pow2(pieces, entry.exponent, entry.bins, device_, &workspace_);
}

std::optional<HistogramObserver::Histogram> HistogramObserver::histogram(
    const std::string& name) const {
  const auto it = entries_.find(name);
  if (it == entries_.end() || !it->second.started) return std::nullopt;
  const Entry& e = it->second;
  size_t used = e.bins.size();
  while (used > 0 && e.bins[used - 1] == 0) --used;
  used = std::max(used, std::min(e.bins.size(), size_t{256}));
  Histogram h;
  h.counts.assign(e.bins.begin(), e.bins.begin() + static_cast<std::ptrdiff_t>(used));
  h.range = std::ldexp(static_cast<double>(used), e.exponent);
  return h;
}

}  // namespace qforge
