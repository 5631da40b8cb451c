#pragma once
// Calibration observers: what calibrate() keeps of each activation while the data set streams
// through the Executor, in one pass. Memory is bounded by the number of tensors (a range and a
// histogram of a fixed number of bins per tensor), never by the number of samples.
//
// RangeObserver keeps min, max and NaN counts. HistogramObserver fills a histogram of |x| whose
// bins are a power of two wide, aligned at 0 (kernels/calib.h, histogram_abs_pow2): the width
// is the least power of two that holds every value seen so far in its bins, and when a batch
// needs a wider one, adjacent bins merge, which is exact because the bin edges nest. So the
// result is the histogram one call over all values would give at the final width: like the
// second pass over [0, amax] that it replaces, it depends on neither batch size nor sample
// order, and the model runs once. The largest |x| lands in the upper half of the bins (at
// least 1025 of 2048 cover [0, amax]). Each keeps the device buffers of its kernels for the
// whole pass (kernels/workspace.h): one allocation per buffer, not one per activation and batch.
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kernels/calib.h"
#include "kernels/device.h"
#include "kernels/workspace.h"

namespace qforge {

struct TensorStats {
  float min = 0.0f;  // over the values that are numbers; 0 when there are none
  float max = 0.0f;
  uint64_t count = 0;  // values that are numbers
  uint64_t nan = 0;
  [[nodiscard]] float amax() const;  // max(|min|, |max|)
};

class RangeObserver {
 public:
  explicit RangeObserver(Device device) : device_(device) {}
  // Returns the range of `values` alone.
  ValueRange observe(const std::string& name, std::span<const float> values);
  // The same for values in several pieces (the real rows of a padded batch, where they lie).
  ValueRange observe(const std::string& name, FloatPieces pieces);
  // Adds the range of values already measured (HistogramObserver::observe gives one).
  void add(const std::string& name, const ValueRange& range);
  [[nodiscard]] const std::map<std::string, TensorStats>& stats() const { return stats_; }

 private:
  Device device_;
  KernelWorkspace workspace_;
  std::map<std::string, TensorStats> stats_;
};

class HistogramObserver {
 public:
  explicit HistogramObserver(int64_t bins, Device device) : bins_(bins), device_(device) {}
  // Adds |values| to `name`'s histogram; `range` is minmax(values). A tensor that reaches +-inf
  // keeps no histogram (it gets no range either).
  void observe(const std::string& name, std::span<const float> values, const ValueRange& range);
  // The same for values in several pieces, `range` their minmax together.
  void observe(const std::string& name, FloatPieces pieces, const ValueRange& range);
  // The same with the range measured in the same read of the values (kernels/calib.h,
  // range_histogram_abs_pow2): the same histogram, and the range of `pieces`, returned.
  ValueRange observe(const std::string& name, FloatPieces pieces);

  struct Histogram {
    std::vector<uint64_t> counts;  // bins [0, counts.size()) of width 2^exponent
    double range = 0;              // counts.size() * 2^exponent: the top edge, >= every |x|
  };
  // The histogram up to its last non-empty bin (at least min(bins, 256) bins, so that every
  // threshold search has room), or nothing for a tensor without a non-zero finite value.
  [[nodiscard]] std::optional<Histogram> histogram(const std::string& name) const;

 private:
  struct Entry {
    bool started = false;  // a non-zero value was seen: `exponent` and `bins` hold
    bool infinite = false;
    int exponent = 0;
    uint64_t zeros = 0;  // values counted before it started: all zeros
    std::vector<uint64_t> bins;
  };
  // `entry` at width 2^exponent (at least its own): started, its zeros in bin 0, or its bins
  // widened.
  void at_width(Entry& entry, int exponent) const;
  int64_t bins_;
  Device device_;
  KernelWorkspace workspace_;
  std::map<std::string, Entry> entries_;
  std::vector<uint64_t> batch_;  // one batch's counts
};

}  // namespace qforge
