#include "quant/calib/observer.h"

#include <cmath>

#include "kernels/calib.h"

namespace qforge {

namespace {

// Min and max under the kernels' order, where -0.0 < +0.0, so a merge gives what one call over
// all values would.
bool before(float a, float b) { return a < b || (a == b && std::signbit(a) && !std::signbit(b)); }

}  // namespace

float TensorStats::amax() const { return std::fmax(std::fabs(min), std::fabs(max)); }

void RangeObserver::observe(const std::string& name, std::span<const float> values) {
  const ValueRange r = minmax(values, device_, &workspace_);
  TensorStats& s = stats_[name];
  if (r.count > 0) {
    if (s.count == 0 || before(r.min, s.min)) s.min = r.min;
    if (s.count == 0 || before(s.max, r.max)) s.max = r.max;
  }
  s.count += r.count;
  s.nan += r.nan;
}

HistogramObserver::HistogramObserver(const std::map<std::string, float>& amax, int64_t bins,
                                     Device device)
    : device_(device) {
  for (const auto& [name, a] : amax) {
    if (a > 0.0f) entries_[name] = {a, std::vector<uint64_t>(static_cast<size_t>(bins), 0)};
  }
}

void HistogramObserver::observe(const std::string& name, std::span<const float> values) {
  const auto it = entries_.find(name);
  if (it == entries_.end()) return;
  histogram_abs(values, it->second.range, it->second.bins, device_, &workspace_);
}

const std::vector<uint64_t>* HistogramObserver::histogram(const std::string& name) const {
  const auto it = entries_.find(name);
  return it == entries_.end() ? nullptr : &it->second.bins;
}

}  // namespace qforge
