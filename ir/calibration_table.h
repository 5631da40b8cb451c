#pragma once
// Activation ranges found by calibration: what the static INT8 QDQ pass turns into scales
// (scale = amax / 127) and what the table writers and readers exchange. Plain data with no code
// to link, so importers/ and exporters/ include it as they include ir/ types.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace qforge {

struct TensorRange {
  float amax = 0;  // threshold for symmetric quantization; 0 for an all-zero tensor
  float min = 0;   // smallest value seen
  float max = 0;   // largest value seen
};

struct CalibrationTable {
  std::string method;          // "minmax" | "percentile" | "entropy" | "mse" (calib_methods.h)
  std::string dataset_digest;  // sha256 of the calibration data, hex ("" when imported from a
                               // TensorRT cache, which does not record it)
  int64_t samples = 0;
  std::map<std::string, TensorRange> ranges;  // tensor name -> range
  // The histograms of |x| that calibration counted (up to 2048 bins by default, equal width,
  // over [0, histogram_ranges[name]], a range at or above max(|min|, |max|)), for reports (the
  // threshold every method would choose on them). Never written to a table file: empty when
  // the table was read from one, or when the method needed none.
  std::map<std::string, std::vector<uint64_t>> histograms;
  std::map<std::string, double> histogram_ranges;
};

}  // namespace qforge
