#pragma once
// The HTML report behind `--report FILE` (convert, calibrate, compare) and `qforge report`:
// cli/ assembles the report document (the --json result, without timings, plus calibration's
// histograms with every method's threshold), exporters/report/ draws it.
#include <string>
#include <vector>

#include "cli/app.h"
#include "ir/calibration_table.h"
#include "kernels/device.h"

namespace qforge::cli {

// Bars per histogram in a report (the thresholds are searched on the full histogram).
inline constexpr size_t kReportHistogramBars = 128;

// For each tensor of `table` with a histogram: the histogram summed into kReportHistogramBars
// bars over [0, largest |x|], and the threshold (and clipped fraction) that minmax, percentile
// (at `percentile`), entropy and mse choose on the full histogram, by the same code that
// calibration runs (quant/calib/calibration.h, choose_threshold), on `device` (CPU and CUDA
// choose the same thresholds). An array, by tensor name.
Json calibration_histograms_json(const CalibrationTable& table, double percentile, Device device);

// --report FILE given with these inputs and outputs: Error(Usage) when it names one of them,
// Error(IO) when its folder does not exist. Run before any work.
void check_report_path(const std::string& report, const std::vector<std::string>& others);

// The report of `document` written to `path` (atomically). With `require_content`, a document
// with nothing to chart is refused (Error(InvalidInput)) instead of drawn as a summary.
void write_report(const Json& document, const std::string& path, const std::string& where,
                  bool require_content = false);

}  // namespace qforge::cli
