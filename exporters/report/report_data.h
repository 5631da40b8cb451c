#pragma once
// What an HTML report shows (exporters/report/html_report.h), as plain data, and where it comes
// from: a JSON document that qforge wrote. report_data_from_json reads any of
//   - a bundle's report.json ({"passes": [...], "histograms": [...]}),
//   - the --json result of `convert`, `calibrate` or `compare` (what --report feeds it, with
//     "histograms" added where calibration counted them),
// and takes from it the sections it finds: per-tensor weight error of each quantization pass,
// compare's per-output and per-layer figures, the calibration ranges and histograms with every
// method's threshold, and the accuracy budget's precision, sensitivity ranking and search.
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace qforge::report {

using Json = nlohmann::ordered_json;

// One value's figures. SQNR may be +-inf (+inf: exact); absent figures are not shown.
struct ErrorRow {
  std::string name;
  std::optional<double> sqnr_db;
  std::optional<double> cosine;
  std::optional<double> max_abs_error;
};

// A bar chart of per-layer error with its table; rows worst first (lowest SQNR, then lowest
// cosine, then name).
struct ErrorSection {
  std::string id;     // HTML anchor, unique in the report
  std::string title;  // "Weight quantization error: static-int8"
  std::string about;  // one sentence: what the figures measure
  std::vector<ErrorRow> rows;
};

// compare's figures for one graph output.
struct OutputRow {
  ErrorRow error;
  std::optional<double> top1_agreement;  // fractions in [0, 1]
  std::optional<double> top1_float;
  std::optional<double> top1_quant;
};

// A calibrated tensor's range, as the calibrate pass reported it.
struct RangeRow {
  std::string name;
  double min = 0, max = 0;
  double observed_amax = 0;  // max(|min|, |max|)
  double amax = 0;           // the threshold the method chose
  double clipped_fraction = 0;
};

struct MethodThresholdRow {
  std::string method;  // minmax, percentile, entropy, mse
  double amax = 0;
  double clipped_fraction = 0;
};

// The histogram of |x| of one calibrated tensor, re-binned into equal bars over [0, range],
// with the threshold each method chooses on the full histogram.
struct HistogramSection {
  std::string name;
  double range = 0;  // the histogram's upper end: the largest |x| seen
  int64_t source_bins = 0;  // bins the thresholds were searched on (2048)
  std::vector<uint64_t> bars;
  std::vector<MethodThresholdRow> thresholds;
  std::string chosen;  // the method calibration used ("" when unknown)
  std::optional<double> percentile;  // the percentile method's setting
};

struct BudgetTargetValue {
  std::string metric;  // "cosine", "sqnr_db" or "top1_drop" (keys of a trial's figures)
  double value = 0;
  bool at_least = true;  // cosine and SQNR: at least; top-1 drop: at most
};

struct BudgetFigures {
  double cosine = 1;
  double sqnr_db = 0;
  std::optional<double> top1_drop;  // points
};

struct BudgetLayerRow {
  std::string name;
  std::string precision;
  std::optional<int64_t> rank;          // 1 = most sensitive
  std::optional<BudgetFigures> alone;   // the model with this layer alone quantized
};

struct BudgetTrialRow {
  std::string trial;
  int64_t kept = 0;
  bool meets = false;
  BudgetFigures figures;
};

struct BudgetSection {
  std::string target;  // "cosine >= 0.98"
  std::vector<BudgetTargetValue> targets;
  std::string precision;  // "int8 3, float 1"
  std::optional<BudgetFigures> final_figures;
  std::vector<BudgetLayerRow> layers;  // node order
  std::vector<BudgetTrialRow> trials;  // in the order they ran
};

struct ReportData {
  std::string title;
  std::vector<std::pair<std::string, std::string>> summary;  // key, value, in order
  std::vector<OutputRow> outputs;
  std::vector<ErrorSection> errors;
  std::optional<BudgetSection> budget;
  std::vector<RangeRow> ranges;
  std::vector<HistogramSection> histograms;
  std::vector<std::string> warnings;  // "pass: message"
  std::string data_json;  // the source document, compact, for the page's JSON block

  // Whether there is a chart or table beyond the summary.
  [[nodiscard]] bool has_content() const {
    return !outputs.empty() || !errors.empty() || budget || !ranges.empty() || !histograms.empty();
  }
};

// Reads a report document. Throws Error(InvalidInput) naming `where` and the JSON path of the
// first value that has the wrong type or is out of range.
ReportData report_data_from_json(const Json& document, const std::string& where);

// The |x| histogram of `bins` (over [0, range]) summed into `bars` equal bars (bars <= bins):
// bar b holds bins [b * n / bars, (b + 1) * n / bars).
std::vector<uint64_t> rebin_histogram(const std::vector<uint64_t>& bins, size_t bars);

// "cosine >= 0.98, SQNR >= 20 dB, top-1 drop <= 0.3 points" (the budget's target text) as values;
// parts it does not recognize are left out.
std::vector<BudgetTargetValue> parse_budget_target(const std::string& text);

}  // namespace qforge::report
