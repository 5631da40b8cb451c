#pragma once
// The calibration flags `qforge calibrate` and `qforge convert --quant int8` share, as data
// (cli/cmd_calibrate.h registers them on a command, cli/calibration_job.h runs them).
#include <cstdint>
#include <string>

namespace qforge::cli {

struct CalibFlags {
  std::string data;
  std::string method = "entropy";
  double percentile = 99.99;
  int64_t calib_size = 0;  // 0: every sample
  int64_t batch = 32;
  // --calib-mask: the token-mask input whose padded positions calibration leaves out; "auto"
  // (attention_mask when the model has it), "none", or an input name.
  std::string mask = "auto";
  bool drop_bad_samples = false;  // skip samples whose float inputs hold NaN or Inf
  // --report: count the histograms for minmax too, so that the report shows every method's
  // threshold (the other methods count them anyway).
  bool report_histograms = false;
};

// The flags that tune --calib (every calibration flag but --calib itself).
inline constexpr const char* kCalibTuningFlags[] = {"--method", "--percentile", "--calib-size",
                                                    "--batch", "--calib-mask",
                                                    "--drop-bad-samples"};

}  // namespace qforge::cli
