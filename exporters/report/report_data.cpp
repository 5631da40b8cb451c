#include "exporters/report/report_data.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <regex>

#include "ir/error.h"
#include "ir/json_number.h"

namespace qforge::report {

namespace {

constexpr size_t kMaxBars = 4096;

// Reads values out of the document, naming the JSON path of whatever is wrong.
class Reader {
 public:
  explicit Reader(std::string where) : where_(std::move(where)) {}

  [[noreturn]] void fail(const std::string& path, const std::string& what) const {
    fail_invalid(where_ + ": " + path + " " + what +
                 "; give a bundle's report.json or the --json output of qforge convert, "
                 "calibrate or compare");
  }

  const Json& object(const Json& j, const std::string& path) const {
    if (!j.is_object()) fail(path, "is not an object");
    return j;
  }
  const Json& array(const Json& j, const std::string& path) const {
    if (!j.is_array()) fail(path, "is not an array");
    return j;
  }
  std::string text(const Json& j, const std::string& path) const {
    if (!j.is_string()) fail(path, "is not a string");
    return j.get<std::string>();
  }
  // A number, or "inf", "-inf", "nan" (ir/json_number.h), or a figure as text ("31.5 dB",
  // "exact").
  double number(const Json& j, const std::string& path) const {
    if (const auto v = json_to_number(j)) return *v;
    if (j.is_string()) {
      const std::string& s = j.get_ref<const std::string&>();
      if (s == "exact") return INFINITY;
      char* end = nullptr;
      const double v = std::strtod(s.c_str(), &end);
      if (end != s.c_str() && std::string_view(end) == " dB") return v;
    }
    fail(path, "is not a number");
  }
  double finite(const Json& j, const std::string& path) const {
    const double v = number(j, path);
    if (!std::isfinite(v)) fail(path, "is not a finite number");
    return v;
  }
  int64_t integer(const Json& j, const std::string& path) const {
    if (!j.is_number_integer()) fail(path, "is not an integer");
    return j.get<int64_t>();
  }
  uint64_t count(const Json& j, const std::string& path) const {
    if (!j.is_number_unsigned() && !(j.is_number_integer() && j.get<int64_t>() >= 0)) {
      fail(path, "is not a count (an integer >= 0)");
    }
    return j.get<uint64_t>();
  }
  std::optional<double> optional_number(const Json& obj, const char* key,
                                        const std::string& path) const {
    if (!obj.contains(key) || obj[key].is_null()) return std::nullopt;
    return number(obj[key], path + "." + key);
  }
  const Json& member(const Json& obj, const char* key, const std::string& path) const {
    if (!obj.contains(key)) fail(path, std::string("has no \"") + key + "\"");
    return obj[key];
  }

 private:
  std::string where_;
};

std::string at(const std::string& path, size_t i) { return path + "[" + std::to_string(i) + "]"; }

ErrorRow error_row(const Reader& r, const Json& row, const std::string& path) {
  r.object(row, path);
  ErrorRow e;
  e.name = r.text(r.member(row, "name", path), path + ".name");
  e.sqnr_db = r.optional_number(row, "sqnr_db", path);
  e.cosine = r.optional_number(row, "cosine", path);
  e.max_abs_error = r.optional_number(row, "max_abs_error", path);
  return e;
}

// Worst first: lowest SQNR (absent last), then lowest cosine, then name.
void sort_worst_first(std::vector<ErrorRow>& rows) {
  const auto key = [](const std::optional<double>& v) {
    return v && !std::isnan(*v) ? *v : INFINITY;
  };
  std::stable_sort(rows.begin(), rows.end(), [&](const ErrorRow& a, const ErrorRow& b) {
    if (key(a.sqnr_db) != key(b.sqnr_db)) return key(a.sqnr_db) < key(b.sqnr_db);
    if (key(a.cosine) != key(b.cosine)) return key(a.cosine) < key(b.cosine);
    return a.name < b.name;
  });
}

void read_ranges(const Reader& r, const Json& stats, const std::string& path, ReportData& out) {
  r.object(stats, path);
  if (!stats.contains("tensors")) return;
  const Json& rows = r.array(stats["tensors"], path + ".tensors");
  for (size_t i = 0; i < rows.size(); ++i) {
    const std::string p = at(path + ".tensors", i);
    const Json& row = r.object(rows[i], p);
    RangeRow g;
    g.name = r.text(r.member(row, "name", p), p + ".name");
    g.min = r.number(r.member(row, "min", p), p + ".min");
    g.max = r.number(r.member(row, "max", p), p + ".max");
    g.observed_amax = r.number(r.member(row, "observed_amax", p), p + ".observed_amax");
    g.amax = r.number(r.member(row, "amax", p), p + ".amax");
    g.clipped_fraction = r.optional_number(row, "clipped_fraction", p).value_or(0.0);
    out.ranges.push_back(std::move(g));
  }
}

BudgetFigures budget_figures(const Reader& r, const Json& j, const std::string& path) {
  r.object(j, path);
  BudgetFigures f;
  f.cosine = r.number(r.member(j, "cosine", path), path + ".cosine");
  f.sqnr_db = r.number(r.member(j, "sqnr_db", path), path + ".sqnr_db");
  f.top1_drop = r.optional_number(j, "top1_drop", path);
  return f;
}

BudgetSection read_budget(const Reader& r, const Json& stats, const std::string& path) {
  r.object(stats, path);
  BudgetSection b;
  if (stats.contains("target")) b.target = r.text(stats["target"], path + ".target");
  b.targets = parse_budget_target(b.target);
  if (stats.contains("precision")) b.precision = r.text(stats["precision"], path + ".precision");
  if (stats.contains("final")) b.final_figures = budget_figures(r, stats["final"], path + ".final");
  if (stats.contains("layers")) {
    const Json& rows = r.array(stats["layers"], path + ".layers");
    for (size_t i = 0; i < rows.size(); ++i) {
      const std::string p = at(path + ".layers", i);
      const Json& row = r.object(rows[i], p);
      BudgetLayerRow l;
      l.name = r.text(r.member(row, "name", p), p + ".name");
      l.precision = r.text(r.member(row, "precision", p), p + ".precision");
      if (row.contains("sensitivity_rank")) {
        l.rank = r.integer(row["sensitivity_rank"], p + ".sensitivity_rank");
      }
      if (row.contains("alone")) l.alone = budget_figures(r, row["alone"], p + ".alone");
      b.layers.push_back(std::move(l));
    }
  }
  if (stats.contains("search")) {
    const Json& rows = r.array(stats["search"], path + ".search");
    for (size_t i = 0; i < rows.size(); ++i) {
      const std::string p = at(path + ".search", i);
      const Json& row = r.object(rows[i], p);
      BudgetTrialRow t;
      t.trial = r.text(r.member(row, "trial", p), p + ".trial");
      t.kept = r.integer(r.member(row, "kept", p), p + ".kept");
      const Json& meets = r.member(row, "meets", p);
      if (!meets.is_boolean()) r.fail(p + ".meets", "is not true or false");
      t.meets = meets.get<bool>();
      t.figures = budget_figures(r, row, p);
      b.trials.push_back(std::move(t));
    }
  }
  return b;
}

void read_pass(const Reader& r, const Json& pass, const std::string& path, ReportData& out) {
  r.object(pass, path);
  const std::string name = r.text(r.member(pass, "pass", path), path + ".pass");
  const Json& stats = r.object(r.member(pass, "stats", path), path + ".stats");
  if (pass.contains("warnings")) {
    const Json& w = r.array(pass["warnings"], path + ".warnings");
    for (size_t i = 0; i < w.size(); ++i) {
      out.warnings.push_back(name + ": " + r.text(w[i], at(path + ".warnings", i)));
    }
  }
  if (name == "calibrate") {
    read_ranges(r, stats, path + ".stats", out);
    return;
  }
  if (name == "budget") {
    out.budget = read_budget(r, stats, path + ".stats");
    return;
  }
  if (!stats.contains("tensors") || !stats["tensors"].is_array()) return;
  ErrorSection s;
  s.id = "errors-" + std::to_string(out.errors.size() + 1);
  s.title = "Weight quantization error: " + name;
  s.about = "SQNR of each quantized weight against its float values (10 log10 of sum w^2 / "
            "sum (w - dequantized)^2), worst first.";
  const Json& rows = stats["tensors"];
  for (size_t i = 0; i < rows.size(); ++i) {
    const std::string p = at(path + ".stats.tensors", i);
    if (!rows[i].is_object() || !rows[i].contains("sqnr_db")) continue;  // rows of other kinds
    s.rows.push_back(error_row(r, rows[i], p));
  }
  if (s.rows.empty()) return;
  sort_worst_first(s.rows);
  out.errors.push_back(std::move(s));
}

HistogramSection read_histogram(const Reader& r, const Json& h, const std::string& path) {
  r.object(h, path);
  HistogramSection s;
  s.name = r.text(r.member(h, "name", path), path + ".name");
  s.range = r.finite(r.member(h, "range", path), path + ".range");
  if (!(s.range > 0)) r.fail(path + ".range", "is not above 0");
  const Json& bars = r.array(r.member(h, "bars", path), path + ".bars");
  if (bars.empty() || bars.size() > kMaxBars) {
    r.fail(path + ".bars", "does not hold 1 to " + std::to_string(kMaxBars) + " bars");
  }
  for (size_t i = 0; i < bars.size(); ++i) {
    s.bars.push_back(r.count(bars[i], at(path + ".bars", i)));
  }
  s.source_bins = h.contains("bins") ? r.integer(h["bins"], path + ".bins")
                                     : static_cast<int64_t>(s.bars.size());
  if (s.source_bins < static_cast<int64_t>(s.bars.size())) {
    r.fail(path + ".bins", "is fewer than the bars");
  }
  const Json& t = r.array(r.member(h, "thresholds", path), path + ".thresholds");
  for (size_t i = 0; i < t.size(); ++i) {
    const std::string p = at(path + ".thresholds", i);
    r.object(t[i], p);
    MethodThresholdRow m;
    m.method = r.text(r.member(t[i], "method", p), p + ".method");
    m.amax = r.finite(r.member(t[i], "amax", p), p + ".amax");
    if (m.amax < 0 || m.amax > s.range * 1.000001) r.fail(p + ".amax", "is outside [0, range]");
    m.clipped_fraction = r.optional_number(t[i], "clipped_fraction", p).value_or(0.0);
    s.thresholds.push_back(std::move(m));
  }
  if (h.contains("chosen")) s.chosen = r.text(h["chosen"], path + ".chosen");
  s.percentile = r.optional_number(h, "percentile", path);
  return s;
}

std::string scalar_text(const Json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_null()) return "-";
  return v.dump();
}

std::string title_of(const Json& doc) {
  const auto str = [&doc](const char* key) {
    return doc.contains(key) && doc[key].is_string() ? doc[key].get<std::string>() : "";
  };
  const std::string command = str("command");
  if (command == "compare") return "qforge compare: " + str("float") + " vs " + str("quantized");
  if (command == "convert") return "qforge convert: " + str("input") + " -> " + str("output");
  if (command == "calibrate") return "qforge calibrate: " + str("input");
  return "qforge report";
}

}  // namespace

std::vector<uint64_t> rebin_histogram(const std::vector<uint64_t>& bins, size_t bars) {
  const size_t n = bins.size();
  if (bars == 0 || bars > n) bars = n;
  std::vector<uint64_t> out(bars, 0);
  for (size_t b = 0; b < bars; ++b) {
    for (size_t i = b * n / bars; i < (b + 1) * n / bars; ++i) out[b] += bins[i];
  }
  return out;
}

std::vector<BudgetTargetValue> parse_budget_target(const std::string& text) {
  // The forms of BudgetTarget::text() (quant/budget/budget_search.h).
  static const std::regex part(R"((cosine|SQNR|top-1 drop) (>=|<=) ([-+0-9.eE]+|inf))");
  std::vector<BudgetTargetValue> out;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), part); it != std::sregex_iterator();
       ++it) {
    BudgetTargetValue v;
    const std::string metric = (*it)[1];
    v.metric = metric == "cosine" ? "cosine" : metric == "SQNR" ? "sqnr_db" : "top1_drop";
    v.at_least = (*it)[2] == ">=";
    v.value = std::strtod((*it)[3].str().c_str(), nullptr);
    if (std::isfinite(v.value)) out.push_back(std::move(v));
  }
  return out;
}

ReportData report_data_from_json(const Json& doc, const std::string& where) {
  const Reader r(where);
  r.object(doc, "the document");
  ReportData out;
  out.title = title_of(doc);
  for (const auto& [key, value] : doc.items()) {
    if (value.is_structured() || key == "ok" || key == "seconds") continue;
    out.summary.emplace_back(key, scalar_text(value));
  }
  if (doc.contains("passes")) {
    const Json& passes = r.array(doc["passes"], "passes");
    for (size_t i = 0; i < passes.size(); ++i) read_pass(r, passes[i], at("passes", i), out);
  }
  if (doc.contains("calibration")) read_ranges(r, doc["calibration"], "calibration", out);
  if (doc.contains("outputs")) {
    const Json& rows = r.array(doc["outputs"], "outputs");
    for (size_t i = 0; i < rows.size(); ++i) {
      OutputRow o;
      o.error = error_row(r, rows[i], at("outputs", i));
      o.top1_agreement = r.optional_number(rows[i], "top1_agreement", at("outputs", i));
      o.top1_float = r.optional_number(rows[i], "top1_accuracy_float", at("outputs", i));
      o.top1_quant = r.optional_number(rows[i], "top1_accuracy_quant", at("outputs", i));
      out.outputs.push_back(std::move(o));
    }
  }
  if (doc.contains("layers")) {
    const Json& rows = r.array(doc["layers"], "layers");
    ErrorSection s;
    s.id = "errors-" + std::to_string(out.errors.size() + 1);
    s.title = "Per-layer error: quantized against float activations";
    s.about = "SQNR and cosine of each value both models compute, the quantized one as its "
              "readers see it (after Q/DQ), on the comparison data; worst first.";
    for (size_t i = 0; i < rows.size(); ++i) {
      s.rows.push_back(error_row(r, rows[i], at("layers", i)));
    }
    sort_worst_first(s.rows);
    out.errors.insert(out.errors.begin(), std::move(s));
  }
  if (doc.contains("histograms")) {
    const Json& hs = r.array(doc["histograms"], "histograms");
    for (size_t i = 0; i < hs.size(); ++i) {
      out.histograms.push_back(read_histogram(r, hs[i], at("histograms", i)));
    }
  }
  Json encoded = doc;
  encode_nonfinite(encoded);
  out.data_json = encoded.dump();
  return out;
}

}  // namespace qforge::report
