#include "cli/calibration_job.h"

#include <chrono>
#include <string>
#include <utility>

#include "cli/progress.h"
#include "importers/calib_table_reader.h"
#include "importers/dataset/dataset.h"
#include "ir/calib_methods.h"
#include "ir/error.h"
#include "quant/calib/calibration.h"
#include "quant/calib/token_mask.h"

namespace qforge::cli {

namespace {

CalibMethod parse_method(const std::string& name) {
  const auto method = calib_method_from_name(name);
  if (!method) fail_usage("--method '" + name + "' is not " + calib_method_list());
  return *method;
}

}  // namespace

CalibrationTable run_calibration(const Graph& graph, const CalibFlags& flags, Device device,
                                 int threads, bool show_progress, PassReport& report,
                                 std::optional<std::set<std::string>> only) {
  const auto start = std::chrono::steady_clock::now();
  report.pass = "calibrate";
  Dataset data(flags.data, calibration_inputs(graph), flags.calib_size, flags.batch,
               "calibration data", flags.drop_bad_samples ? BadSamples::Drop : BadSamples::Refuse);
  CalibOptions options;
  options.method = parse_method(flags.method);
  options.percentile = flags.percentile;
  options.device = device;
  options.threads = threads;
  options.mask_input = resolve_mask_input(graph, flags.mask);
  options.histograms_for_minmax = flags.report_histograms;
  options.only = std::move(only);
  Progress progress("calibrate", "samples", show_progress);
  options.progress = [&progress](int64_t done, int64_t total) { progress.update(done, total); };
  CalibrationTable table = calibrate(graph, data, options, report);
  progress.finish();
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return table;
}

CalibrationTable import_calibration(const std::string& path, PassReport& report) {
  report.pass = "import-calib";
  CalibrationTable table = read_calibration_table(path);
  report.stats["file"] = path;
  return table;
}

void add_calibration_stats(const CalibrationTable& table, PassReport& report) {
  report.stats["method"] = table.method;
  report.stats["samples"] = table.samples;
  report.stats["ranges"] = table.ranges.size();
}

}  // namespace qforge::cli

