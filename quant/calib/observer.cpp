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
  add(name, r);
  return r;
}

void RangeObserver::add(const std::string& name, const ValueRange& r) {
  TensorStats& s = stats_[name];
  if (r.count > 0) {
    if (s.count == 0 || before(r.min, s.min)) s.min = r.min;
    if (s.count == 0 || before(s.max, r.max)) s.max = r.max;
  }
  s.count += r.count;
  s.nan += r.nan;
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
  if (!entry.started && amax == 0.0f) {  // zeros: bin 0 at whatever width comes
    entry.zeros += range.count;
    return;
  }
  const int need = histogram_exponent(amax, bins_);
  at_width(entry, entry.started ? std::max(entry.exponent, need) : need);
  histogram_abs_pow2(pieces, entry.exponent, entry.bins, device_, &workspace_);
}

void HistogramObserver::at_width(Entry& entry, int exponent) const {
  if (!entry.started) {
    entry.started = true;
    entry.exponent = exponent;
    entry.bins.assign(static_cast<size_t>(bins_), 0);
    entry.bins[0] = entry.zeros;
    return;
  }
  widen_pow2_bins(entry.bins, exponent - entry.exponent);
  entry.exponent = exponent;
}

ValueRange HistogramObserver::observe(const std::string& name, FloatPieces pieces) {
  Entry& entry = entries_[name];
  if (entry.infinite) return minmax(pieces, device_, &workspace_);
  batch_.assign(static_cast<size_t>(bins_), 0);
  const RangeHistogram counted = range_histogram_abs_pow2(
      pieces, entry.started ? entry.exponent : kNoExponent, batch_, device_, &workspace_);
  const ValueRange& range = counted.range;
  if (range.count == 0) return range;  // nothing but NaNs
  if (!std::isfinite(abs_max(range.min, range.max))) {
    entry = Entry{};
    entry.infinite = true;
    return range;
  }
  if (!counted.binned) {  // zeros, before any width: bin 0 at whatever width comes
    entry.zeros += range.count;
    return range;
  }
  at_width(entry, counted.exponent);
  for (size_t b = 0; b < entry.bins.size(); ++b) entry.bins[b] += batch_[b];
  return range;
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
