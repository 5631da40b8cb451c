#include "cli/report_job.h"

#include <cmath>
#include <filesystem>

#include "exporters/report/html_report.h"
#include "exporters/report/report_data.h"
#include "ir/calib_methods.h"
#include "ir/error.h"
#include "quant/calib/calibration.h"

namespace qforge::cli {

namespace fs = std::filesystem;

Json calibration_histograms_json(const CalibrationTable& table, double percentile, Device device) {
  Json out = Json::array();
  for (const auto& [name, hist] : table.histograms) {
    const auto range_it = table.ranges.find(name);
    if (range_it == table.ranges.end() || hist.empty()) continue;
    // The largest |x| seen, and the histogram's top edge (at or above it).
    const float amax = std::fmax(std::fabs(range_it->second.min), std::fabs(range_it->second.max));
    const auto top = table.histogram_ranges.find(name);
    const double range = top != table.histogram_ranges.end() ? top->second : amax;
    Json thresholds = Json::array();
    for (const CalibMethodInfo& m : kCalibMethods) {
      const MethodThreshold t = choose_threshold(m.method, hist, range, amax, percentile, device);
      thresholds.push_back(
          {{"method", std::string(m.name)}, {"amax", t.amax}, {"clipped_fraction", t.clipped}});
    }
    out.push_back({{"name", name},
                   {"range", range},
                   {"bins", hist.size()},
                   {"bars", report::rebin_histogram(hist, kReportHistogramBars)},
                   {"chosen", table.method},
                   {"percentile", percentile},
                   {"thresholds", std::move(thresholds)}});
  }
  return out;
}

void check_report_path(const std::string& report, const std::vector<std::string>& others) {
  if (report.empty()) return;
  std::error_code ec;
  const fs::path target = fs::weakly_canonical(report, ec);
  for (const std::string& other : others) {
    if (other.empty()) continue;
    std::error_code ec2;
    if (target == fs::weakly_canonical(other, ec2)) {
      fail_usage("--report '" + report + "' is also '" + other +
                 "', an input or output of this command; give the report its own name "
                 "(report.html)");
    }
  }
  fs::path parent = fs::path(report).parent_path();
  if (parent.empty()) parent = ".";
  if (!fs::is_directory(parent, ec)) {
    fail_io("--report '" + report + "': folder '" + parent.string() +
            "' does not exist; create it first");
  }
  if (fs::is_directory(report, ec)) {
    fail_usage("--report '" + report + "' is a folder; give a file name (report.html)");
  }
}

void write_report(const Json& document, const std::string& path, const std::string& where,
                  bool require_content) {
  const report::ReportData data = report::report_data_from_json(document, where);
  if (require_content && !data.has_content()) {
    fail_invalid(where + " holds no per-layer error, calibration or accuracy budget to report; "
                 "give a bundle's report.json or the --json output of convert, calibrate or "
                 "compare");
  }
  report::write_html_report(data, path);
}

}  // namespace qforge::cli
