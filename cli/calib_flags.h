#pragma once
// The calibration flags `qforge calibrate` and `qforge convert --quant int8` share, as data
// (cli/cmd_calibrate.h registers them on a command).
#include <cstdint>
#include <string>

namespace qforge::cli {

struct CalibFlags {
  std::string data;
  std::string method = "entropy";
  double percentile = 99.99;
  int64_t calib_size = 0;  // 0: every sample
  int64_t batch = 32;
  bool drop_bad_samples = false;  // skip samples whose float inputs hold NaN or Inf
};

// The flags that tune --calib (every calibration flag but --calib itself).
inline constexpr const char* kCalibTuningFlags[] = {"--method", "--percentile", "--calib-size",
                                                    "--batch", "--drop-bad-samples"};

}  // namespace qforge::cli
