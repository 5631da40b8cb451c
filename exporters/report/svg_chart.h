#pragma once
// Inline SVG charts for the HTML report: horizontal bars (per-layer error, sensitivity), a
// histogram with threshold markers, and a curve of points with a target line. Each chart is
// one <svg class="chart ..."> with its bars, axes (<g class="axis ...">, ticks and their
// labels), an axis title and a <title> on every mark; colours come from the page's CSS classes.
// Every name is escaped; the same spec gives the same bytes.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace qforge::report {

struct BarRow {
  std::string label;       // full name: shortened on the chart, whole in the tooltip
  double value = 0;        // +-inf: a bar to the chart's end (+inf) or start (-inf)
  std::string value_text;  // written beside the bar
  std::string css_class;   // added to "bar"
};

struct BarChartSpec {
  std::string title;
  std::string axis_label;
  std::vector<BarRow> rows;  // top to bottom
  // The value axis; unset ends come from the finite values (and 0).
  std::optional<double> lo, hi;
  // Bars start at the axis' low end (cosine, zoomed to its decade) instead of at 0.
  bool from_lo = false;
};

struct Marker {
  std::string label;
  double value = 0;
  std::string css_class;  // added to "threshold"
};

struct HistogramChartSpec {
  std::string title;
  std::string x_label;
  double range = 0;             // bars cover [0, range] in equal widths
  std::vector<uint64_t> bars;
  std::vector<Marker> markers;  // vertical lines at their values
};

struct CurvePoint {
  double x = 0, y = 0;
  bool good = false;  // meets the target
  std::string label;  // tooltip
};

// x: a count (layers kept): whole-number ticks.
struct CurveChartSpec {
  std::string title;
  std::string x_label, y_label;
  std::vector<CurvePoint> points;  // joined in this order
  std::optional<double> target;    // a dashed horizontal line
  std::string target_label;
};

std::string bar_chart_svg(const BarChartSpec& spec);
std::string histogram_svg(const HistogramChartSpec& spec);
std::string curve_svg(const CurveChartSpec& spec);

// About `count` round ticks (steps of 1, 2 or 5 x 10^k) covering [lo, hi], lo < hi.
std::vector<double> nice_ticks(double lo, double hi, int count);

}  // namespace qforge::report
