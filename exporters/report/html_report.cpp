#include "exporters/report/html_report.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <set>

#include "exporters/atomic_file.h"
#include "exporters/report/html_text.h"
#include "exporters/report/svg_chart.h"
#include "ir/error.h"
#include "qforge/version.h"

namespace qforge::report {

namespace {

constexpr const char* kStyle = R"(
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px auto;max-width:1000px;color:#222;background:#fff}
h1{font-size:22px}h2{font-size:18px;margin-top:36px;border-bottom:1px solid #ccc}h3{font-size:15px;margin:24px 0 4px;word-break:break-all}
table{border-collapse:collapse;margin:8px 0 16px;font-size:13px}td,th{border:1px solid #ddd;padding:2px 8px;text-align:left}
td.num{text-align:right;font-variant-numeric:tabular-nums}th{background:#f3f3f3}td.name{word-break:break-all;max-width:520px}
figure{margin:8px 0}figcaption{font-size:12px;color:#555}nav a{margin-right:14px}
.chart text{font-size:11px;fill:#333}.chart .chart-title{font-size:13px;font-weight:600}
.axis-line,.tick{stroke:#444;stroke-width:1}.grid{stroke:#e4e4e4;stroke-width:1}
.bar{fill:#4878d0}.bar.inf{fill:#a9c1ea}.bar.neg-inf{fill:#c44e52}
.bar.prec-float{fill:#ee854a}.bar.prec-int8{fill:#4878d0}.bar.prec-int4{fill:#6acc64}
.histogram-chart .bar{fill:#8c8c8c}
.threshold .marker{stroke-width:1.5}.threshold.chosen .marker{stroke-width:3}
.threshold.minmax .marker{stroke:#c44e52}.threshold.minmax text{fill:#c44e52}
.threshold.percentile .marker{stroke:#8172b3}.threshold.percentile text{fill:#8172b3}
.threshold.entropy .marker{stroke:#55a868}.threshold.entropy text{fill:#2f7a45}
.threshold.mse .marker{stroke:#dd8452}.threshold.mse text{fill:#b0602c}
.threshold.chosen text{font-weight:700}
.curve{fill:none;stroke:#4878d0;stroke-width:1.5}.point.meets{fill:#55a868}.point.misses{fill:#c44e52}
.target-line{stroke:#333;stroke-dasharray:6 4}.swatch{display:inline-block;width:12px;height:12px;margin:0 4px 0 12px;vertical-align:middle}
.swatch.prec-float{background:#ee854a}.swatch.prec-int8{background:#4878d0}.swatch.prec-int4{background:#6acc64}
.warning{color:#8a5a00}
)";

// The page's only script: reads the data block back (a JSON error would show in the console)
// and offers it as a download.
constexpr const char* kScript = R"(
(function () {
  var block = document.getElementById("qforge-report-data");
  var data = JSON.parse(block.textContent);
  var link = document.getElementById("download-data");
  var json = JSON.stringify(data, null, 2);
  link.href = URL.createObjectURL(new Blob([json], {type: "application/json"}));
  document.body.setAttribute("data-report", "ready");
})();
)";

std::string esc(const std::string& s) { return escape_html(s); }

std::string num_cell(double v, const std::string& shown) {
  return "<td class=\"num\" data-v=\"" + number_exact(v) + "\">" + esc(shown) + "</td>";
}
std::string opt_cell(const std::optional<double>& v, int decimals) {
  return v ? num_cell(*v, number_fixed(*v, decimals)) : "<td class=\"none\">-</td>";
}
std::string text_cell(const std::string& s, const std::string& css = "") {
  std::string cell = "<td";
  if (!css.empty()) cell += " class=\"" + css + "\"";
  return cell + ">" + esc(s) + "</td>";
}
std::string header_row(std::initializer_list<const char*> names) {
  std::string s = "<tr>";
  for (const char* n : names) s += "<th>" + std::string(n) + "</th>";
  return s + "</tr>";
}
std::string table_open(const std::string& id) {
  return "<table class=\"data\" data-table=\"" + esc(id) + "\">";
}

// Cosine axes start at the decade below the lowest value: 0.99 for 0.9987, 0.9 for 0.95.
double cosine_floor(double lowest) {
  if (!(lowest < 1)) return 0.99;
  if (lowest <= 0) return -1;
  const double decade = std::pow(10.0, std::ceil(std::log10(1 - lowest)));
  return std::max(-1.0, 1 - decade);
}

std::string figure(const std::string& svg, const std::string& caption) {
  return "<figure>" + svg + "<figcaption>" + esc(caption) + "</figcaption></figure>";
}

std::string error_section(const ErrorSection& s) {
  std::string h = "<section id=\"" + esc(s.id) + "\"><h2>" + esc(s.title) + "</h2><p>" +
                  esc(s.about) + "</p>";
  const size_t shown = std::min(s.rows.size(), kMaxChartRows);
  const std::string which = shown < s.rows.size()
                                ? "the worst " + std::to_string(shown) + " of " +
                                      std::to_string(s.rows.size()) + "; the table lists all"
                                : std::to_string(s.rows.size()) + " values";
  BarChartSpec sqnr{"SQNR per value, worst first", "SQNR (dB); longer is better", {}, {}, {},
                    false};
  BarChartSpec cosine{"Cosine per value, worst first", "cosine similarity", {}, {}, {}, true};
  double lowest_cosine = 1;
  for (size_t i = 0; i < shown; ++i) {
    const ErrorRow& r = s.rows[i];
    if (r.sqnr_db) sqnr.rows.push_back({r.name, *r.sqnr_db, number_fixed(*r.sqnr_db, 2), ""});
    if (r.cosine) {
      cosine.rows.push_back({r.name, *r.cosine, number_fixed(*r.cosine, 6), ""});
      if (std::isfinite(*r.cosine)) lowest_cosine = std::min(lowest_cosine, *r.cosine);
    }
  }
  if (!sqnr.rows.empty()) h += figure(bar_chart_svg(sqnr), "SQNR in dB, " + which + ".");
  if (!cosine.rows.empty()) {
    cosine.lo = cosine_floor(lowest_cosine);
    cosine.hi = 1.0;
    h += figure(bar_chart_svg(cosine), "Cosine similarity, " + which + "; the axis starts at " +
                                           number_general(*cosine.lo, 6) + ".");
  }
  h += table_open(s.id) + header_row({"#", "value", "SQNR dB", "cosine", "max abs error"});
  for (size_t i = 0; i < s.rows.size(); ++i) {
    const ErrorRow& r = s.rows[i];
    h += "<tr><td class=\"num\">" + std::to_string(i + 1) + "</td>" + text_cell(r.name, "name") +
         opt_cell(r.sqnr_db, 2) + opt_cell(r.cosine, 6) +
         (r.max_abs_error ? num_cell(*r.max_abs_error, number_general(*r.max_abs_error, 6))
                          : "<td class=\"none\">-</td>") +
         "</tr>";
  }
  return h + "</table></section>";
}

std::string outputs_section(const std::vector<OutputRow>& outputs) {
  std::string h = "<section id=\"outputs\"><h2>Outputs</h2><p>Each graph output of the quantized "
                  "model against the float model's on the same data.</p>" +
                  table_open("outputs") +
                  header_row({"output", "SQNR dB", "cosine", "max abs error", "top-1 agreement",
                              "top-1 float", "top-1 quantized"});
  for (const OutputRow& o : outputs) {
    h += "<tr>" + text_cell(o.error.name, "name") + opt_cell(o.error.sqnr_db, 2) +
         opt_cell(o.error.cosine, 6) +
         (o.error.max_abs_error
              ? num_cell(*o.error.max_abs_error, number_general(*o.error.max_abs_error, 6))
              : "<td class=\"none\">-</td>") +
         opt_cell(o.top1_agreement, 4) + opt_cell(o.top1_float, 4) + opt_cell(o.top1_quant, 4) +
         "</tr>";
  }
  return h + "</table></section>";
}

// The figure a budget chart plots: the first target's metric (cosine without a target).
struct PlotMetric {
  std::string key = "cosine";
  std::string label = "output cosine";
  int decimals = 6;
};

PlotMetric plot_metric(const BudgetSection& b) {
  PlotMetric m;
  if (b.targets.empty()) return m;
  m.key = b.targets.front().metric;
  if (m.key == "sqnr_db") m = {m.key, "output SQNR (dB)", 2};
  if (m.key == "top1_drop") m = {m.key, "top-1 drop (points)", 2};
  return m;
}

std::optional<double> figure_of(const BudgetFigures& f, const std::string& key) {
  if (key == "sqnr_db") return f.sqnr_db;
  if (key == "top1_drop") return f.top1_drop;
  return f.cosine;
}

std::string budget_section(const BudgetSection& b) {
  const PlotMetric metric = plot_metric(b);
  std::string h = "<section id=\"budget\"><h2>Accuracy budget</h2><p>Target: " + esc(b.target) +
                  ". Precision chosen: " + esc(b.precision) + ".";
  if (b.final_figures) {
    h += " Final: cosine " + number_fixed(b.final_figures->cosine, 6) + ", SQNR " +
         number_fixed(b.final_figures->sqnr_db, 2) + " dB";
    if (b.final_figures->top1_drop) {
      h += ", top-1 drop " + number_fixed(*b.final_figures->top1_drop, 2) + " points";
    }
    h += ".";
  }
  h += "</p>";
  std::vector<const BudgetLayerRow*> ranked;
  for (const BudgetLayerRow& l : b.layers) {
    if (l.rank && l.alone) ranked.push_back(&l);
  }
  std::stable_sort(ranked.begin(), ranked.end(),
                   [](const BudgetLayerRow* a, const BudgetLayerRow* c) {
                     return *a->rank < *c->rank;
                   });
  if (!ranked.empty()) {
    BarChartSpec chart{"Sensitivity: " + metric.label + " with the layer alone quantized, most "
                       "sensitive first",
                       metric.label, {}, {}, {}, metric.key == "cosine"};
    double lowest = 1;
    std::set<std::string> precisions;
    for (const BudgetLayerRow* l : ranked) {
      const double v = figure_of(*l->alone, metric.key).value_or(NAN);
      const std::string text = number_fixed(v, metric.decimals) + " (" + l->precision + ")";
      chart.rows.push_back({l->name, v, text, css_token("prec-" + l->precision)});
      if (std::isfinite(v)) lowest = std::min(lowest, v);
      precisions.insert(l->precision);
    }
    if (metric.key == "cosine") chart.lo = cosine_floor(lowest), chart.hi = 1.0;
    std::string legend = "<p class=\"legend\">Bar colour: the precision the layer was given:";
    for (const std::string& p : precisions) {
      legend += "<span class=\"swatch " + css_token("prec-" + p) + "\"></span>" + esc(p);
    }
    h += figure(bar_chart_svg(chart), "Each layer's " + metric.label +
                                          " when it alone is quantized and every other layer "
                                          "stays at the top of the ladder, in rank order.");
    h += legend + "</p>";
  }
  h += table_open("budget-layers") + header_row({"rank", "layer", "precision", "cosine alone",
                                                 "SQNR dB alone", "top-1 drop alone"});
  for (const BudgetLayerRow& l : b.layers) {
    h += "<tr>" + (l.rank ? num_cell(static_cast<double>(*l.rank), std::to_string(*l.rank))
                          : "<td class=\"none\">-</td>") +
         text_cell(l.name, "name") + text_cell(l.precision) +
         (l.alone ? opt_cell(l.alone->cosine, 6) + opt_cell(l.alone->sqnr_db, 2) +
                        opt_cell(l.alone->top1_drop, 2)
                  : "<td class=\"none\">-</td><td class=\"none\">-</td><td class=\"none\">-</td>") +
         "</tr>";
  }
  h += "</table>";
  if (!b.trials.empty()) {
    CurveChartSpec curve;
    curve.title = metric.label + " against the layers kept at higher precision";
    curve.x_label = "layers kept at higher precision";
    curve.y_label = metric.label;
    std::vector<const BudgetTrialRow*> sorted;
    for (const BudgetTrialRow& t : b.trials) sorted.push_back(&t);
    std::stable_sort(sorted.begin(), sorted.end(),
                     [](const BudgetTrialRow* a, const BudgetTrialRow* c) {
                       return a->kept < c->kept;
                     });
    for (const BudgetTrialRow* t : sorted) {
      const double y = figure_of(t->figures, metric.key).value_or(NAN);
      if (std::isnan(y)) continue;  // a trial without this figure
      curve.points.push_back({static_cast<double>(t->kept), y, t->meets,
                              t->trial + ": " + std::to_string(t->kept) + " kept, " +
                                  metric.label + " " + number_fixed(y, metric.decimals)});
    }
    for (const BudgetTargetValue& t : b.targets) {
      if (t.metric != metric.key) continue;
      curve.target = t.value;
      curve.target_label = "target " + std::string(t.at_least ? ">= " : "<= ") +
                           number_general(t.value, 6);
      break;
    }
    h += figure(curve_svg(curve), "Every trial of the search (green: meets the target, red: "
                                  "misses it), by the number of layers above the lowest rung.");
    h += table_open("budget-search") +
         header_row({"trial", "kept", "meets", "cosine", "SQNR dB", "top-1 drop"});
    for (const BudgetTrialRow& t : b.trials) {
      h += "<tr>" + text_cell(t.trial) +
           num_cell(static_cast<double>(t.kept), std::to_string(t.kept)) +
           text_cell(t.meets ? "yes" : "no") +
           num_cell(t.figures.cosine, number_fixed(t.figures.cosine, 6)) +
           num_cell(t.figures.sqnr_db, number_fixed(t.figures.sqnr_db, 2)) +
           opt_cell(t.figures.top1_drop, 2) + "</tr>";
    }
    h += "</table>";
  }
  return h + "</section>";
}

std::string ranges_section(const std::vector<RangeRow>& ranges) {
  std::string h = "<section id=\"ranges\"><h2>Calibration ranges</h2><p>Each calibrated "
                  "activation: the values seen and the threshold (amax, scale = amax / 127) "
                  "the method chose.</p>" +
                  table_open("ranges") +
                  header_row({"tensor", "min", "max", "largest |x|", "amax", "clipped"});
  for (const RangeRow& r : ranges) {
    h += "<tr>" + text_cell(r.name, "name") + num_cell(r.min, number_general(r.min, 6)) +
         num_cell(r.max, number_general(r.max, 6)) +
         num_cell(r.observed_amax, number_general(r.observed_amax, 6)) +
         num_cell(r.amax, number_general(r.amax, 6)) +
         num_cell(r.clipped_fraction, number_general(r.clipped_fraction * 100, 4) + " %") + "</tr>";
  }
  return h + "</table></section>";
}

std::string histogram_block(const HistogramSection& s, size_t index) {
  const std::string id = "hist-" + std::to_string(index + 1);
  std::string h = "<div class=\"histogram\" id=\"" + id + "\"><h3>" + esc(s.name) + "</h3>";
  HistogramChartSpec chart;
  chart.title = "|x| of " + shorten_name(s.name, 80);
  chart.x_label = "|x|";
  chart.range = s.range;
  chart.bars = s.bars;
  for (const MethodThresholdRow& t : s.thresholds) {
    const bool chosen = t.method == s.chosen;
    chart.markers.push_back({t.method + " " + number_general(t.amax, 4) + (chosen ? " (used)" : ""),
                             t.amax, css_token(t.method) + (chosen ? " chosen" : "")});
  }
  h += figure(histogram_svg(chart),
              std::to_string(s.bars.size()) + " bars over [0, " + number_general(s.range, 6) +
                  "] (the thresholds were searched on " + std::to_string(s.source_bins) +
                  " bins); counts on a log scale; each line is the threshold a method chooses.");
  h += table_open(id + "-thresholds") +
       header_row({"method", "threshold (amax)", "clipped", "used"});
  for (const MethodThresholdRow& t : s.thresholds) {
    std::string method = t.method;
    if (t.method == "percentile" && s.percentile) method += " " + number_general(*s.percentile, 8);
    h += "<tr>" + text_cell(method) + num_cell(t.amax, number_general(t.amax, 6)) +
         num_cell(t.clipped_fraction, number_general(t.clipped_fraction * 100, 4) + " %") +
         text_cell(t.method == s.chosen ? "yes" : "") + "</tr>";
  }
  h += "</table><details><summary>The " + std::to_string(s.bars.size()) +
       " bars</summary>" + table_open(id + "-bars") + header_row({"from", "to", "count"});
  const double n = static_cast<double>(s.bars.size());
  for (size_t i = 0; i < s.bars.size(); ++i) {
    const double from = s.range * static_cast<double>(i) / n;
    const double to = s.range * static_cast<double>(i + 1) / n;
    h += "<tr>" + num_cell(from, number_general(from, 6)) + num_cell(to, number_general(to, 6)) +
         num_cell(static_cast<double>(s.bars[i]), std::to_string(s.bars[i])) + "</tr>";
  }
  return h + "</table></details></div>";
}

}  // namespace

std::string html_report(const ReportData& d) {
  std::string h = "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
                  "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
                  "<title>" + esc(d.title) + "</title><style>" + kStyle + "</style></head>\n<body>";
  h += "<header><h1>" + esc(d.title) + "</h1><table class=\"summary\">";
  for (const auto& [key, value] : d.summary) {
    h += "<tr><th>" + esc(key) + "</th>" + text_cell(value) + "</tr>";
  }
  h += "</table></header>\n<nav>";
  if (!d.outputs.empty()) h += "<a href=\"#outputs\">Outputs</a>";
  for (const ErrorSection& s : d.errors) {
    h += "<a href=\"#" + esc(s.id) + "\">" + esc(s.title) + "</a>";
  }
  if (d.budget) h += "<a href=\"#budget\">Accuracy budget</a>";
  if (!d.ranges.empty()) h += "<a href=\"#ranges\">Calibration ranges</a>";
  if (!d.histograms.empty()) h += "<a href=\"#histograms\">Histograms</a>";
  h += "<a href=\"#data\">Data</a></nav>\n";
  if (!d.has_content()) {
    h += "<p>This run has no per-layer error, calibration or accuracy budget to chart.</p>\n";
  }
  if (!d.outputs.empty()) h += outputs_section(d.outputs) + "\n";
  for (const ErrorSection& s : d.errors) h += error_section(s) + "\n";
  if (d.budget) h += budget_section(*d.budget) + "\n";
  if (!d.ranges.empty()) h += ranges_section(d.ranges) + "\n";
  if (!d.histograms.empty()) {
    h += "<section id=\"histograms\"><h2>Activation histograms and thresholds</h2><p>For each "
         "calibrated tensor, the histogram of |x| that calibration counted, with the threshold "
         "minmax, percentile, entropy and mse each choose on it.</p>";
    for (size_t i = 0; i < d.histograms.size(); ++i) {
      h += histogram_block(d.histograms[i], i) + "\n";
    }
    h += "</section>\n";
  }
  if (!d.warnings.empty()) {
    h += "<section id=\"warnings\"><h2>Warnings</h2><ul>";
    for (const std::string& w : d.warnings) h += "<li class=\"warning\">" + esc(w) + "</li>";
    h += "</ul></section>\n";
  }
  h += "<section id=\"data\"><h2>Data</h2><p>Every number above comes from this JSON, embedded "
       "in the page: <a id=\"download-data\" download=\"qforge-report.json\">download it</a>.</p>"
       "<script type=\"application/json\" id=\"qforge-report-data\">" +
       escape_script_json(d.data_json) + "</script></section>\n";
  h += "<footer><p>Written by qforge " + std::string(kVersion) + ".</p></footer>";
  h += "<script>" + std::string(kScript) + "</script></body></html>\n";
  return h;
}

void write_html_report(const ReportData& data, const std::filesystem::path& path) {
  const std::string text = html_report(data);
  AtomicFile file(path);
  {
    std::ofstream out(file.temp_path(), std::ios::binary | std::ios::trunc);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    out.close();
    if (!out) fail_io("cannot write the report '" + path.string() + "'");
  }
  file.commit();
}

}  // namespace qforge::report
