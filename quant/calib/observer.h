#pragma once
// Calibration observers: what calibrate() keeps of each activation while the data set streams
// through the Executor. Memory is bounded by the number of tensors (a range, then a histogram
// of a fixed number of bins, per tensor), never by the number of samples.
//
// RangeObserver (pass 1) keeps min, max and NaN counts; HistogramObserver (pass 2) fills a
// histogram of |x| over [0, amax] with amax from pass 1, so neither depends on batch size or
// sample order. Each keeps the device buffers of its kernels for the whole pass
// (kernels/workspace.h): one allocation per buffer, not one per activation and batch.
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

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
  void observe(const std::string& name, std::span<const float> values);
  [[nodiscard]] const std::map<std::string, TensorStats>& stats() const { return stats_; }

 private:
  Device device_;
  KernelWorkspace workspace_;
  std::map<std::string, TensorStats> stats_;
};

class HistogramObserver {
 public:
  // One histogram of `bins` bins per tensor of `amax` with amax > 0; other tensors are ignored.
  HistogramObserver(const std::map<std::string, float>& amax, int64_t bins, Device device);
  void observe(const std::string& name, std::span<const float> values);
  // nullptr for a tensor without a histogram.
  [[nodiscard]] const std::vector<uint64_t>* histogram(const std::string& name) const;

 private:
  struct Entry {
    float range = 0.0f;
    std::vector<uint64_t> bins;
  };
  Device device_;
  KernelWorkspace workspace_;
  std::map<std::string, Entry> entries_;
};

}  // namespace qforge
