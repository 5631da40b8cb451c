#include "exporters/report/svg_chart.h"

#include <algorithm>
#include <cmath>

#include "exporters/report/html_text.h"

namespace qforge::report {

namespace {

constexpr double kWidth = 960;

std::string px(double v) { return number_fixed(v, 1); }

// class="..." with the names escaped (a name from the data may hold any character).
std::string class_attr(const std::string& css) { return "class=\"" + escape_html(css) + "\""; }

// <text> with escaped content.
std::string text_el(const std::string& css, double x, double y, const std::string& anchor,
                    const std::string& content) {
  return "<text " + class_attr(css) + " x=\"" + px(x) + "\" y=\"" + px(y) + "\" text-anchor=\"" +
         anchor + "\">" + escape_html(content) + "</text>";
}

std::string line_el(const std::string& css, double x1, double y1, double x2, double y2) {
  return "<line " + class_attr(css) + " x1=\"" + px(x1) + "\" y1=\"" + px(y1) + "\" x2=\"" +
         px(x2) + "\" y2=\"" + px(y2) + "\"/>";
}

std::string svg_open(const std::string& css, double height, const std::string& title) {
  return "<svg " + class_attr("chart " + css) + " width=\"" + px(kWidth) + "\" height=\"" +
         px(height) + "\" viewBox=\"0 0 " + px(kWidth) + " " + px(height) +
         "\" role=\"img\" aria-label=\"" + escape_html(title) + "\">" +
         text_el("chart-title", 8, 16, "start", title);
}

double tick_step(double span, int count) {
  const double raw = span / std::max(count, 1);
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double r = raw / mag;
  return (r <= 1 ? 1 : r <= 2 ? 2 : r <= 5 ? 5 : 10) * mag;
}

std::string tick_text(double v, double step) {
  if (std::fabs(v) < step * 1e-9) v = 0;
  // Enough decimals for the step, none for whole steps.
  const int decimals = step >= 1 ? 0 : static_cast<int>(std::ceil(-std::log10(step) - 1e-9));
  if (std::fabs(v) >= 1e6 || (v != 0 && std::fabs(v) < 1e-4)) return number_general(v, 3);
  return number_fixed(v, decimals);
}

// A horizontal axis at y over [x0, x1] for values [lo, hi], with ticks and the axis title;
// `integers`: only whole-number ticks (counts).
std::string x_axis(double x0, double x1, double y, double lo, double hi, const std::string& label,
                   double grid_top, bool integers = false) {
  std::string s = "<g class=\"axis x-axis\">" + line_el("axis-line", x0, y, x1, y);
  std::vector<double> ticks = nice_ticks(lo, hi, 6);
  if (integers) std::erase_if(ticks, [](double t) { return t != std::floor(t); });
  const double step = ticks.size() > 1 ? ticks[1] - ticks[0] : tick_step(hi - lo, 6);
  for (double t : ticks) {
    const double x = x0 + (t - lo) / (hi - lo) * (x1 - x0);
    if (grid_top < y) s += line_el("grid", x, grid_top, x, y);
    s += line_el("tick", x, y, x, y + 5);
    s += text_el("tick-label", x, y + 17, "middle", tick_text(t, step));
  }
  s += text_el("axis-label", (x0 + x1) / 2, y + 33, "middle", label);
  return s + "</g>";
}

}  // namespace

std::vector<double> nice_ticks(double lo, double hi, int count) {
  std::vector<double> out;
  if (!(hi > lo) || !std::isfinite(lo) || !std::isfinite(hi)) return out;
  const double step = tick_step(hi - lo, count);
  // k * step as k * digit / 10^e where the step is below 1: 3 x 0.2 is then 0.6, not
  // 0.6000000000000001.
  const int exponent = static_cast<int>(std::floor(std::log10(step) + 1e-9));
  const double scale = std::pow(10.0, -exponent);
  const double digit = std::round(step * scale);
  const auto first = static_cast<int64_t>(std::ceil(lo / step - 1e-9));
  for (int64_t k = first;; ++k) {
    const double t = exponent < 0 ? static_cast<double>(k) * digit / scale
                                  : static_cast<double>(k) * step;
    if (t > hi + step * 1e-9 || out.size() > 100) break;
    out.push_back(t);
  }
  return out;
}

std::string bar_chart_svg(const BarChartSpec& spec) {
  constexpr double kLabelRight = 330, kX0 = 340, kX1 = kWidth - 90, kTop = 30, kRow = 18;
  double lo = INFINITY, hi = -INFINITY;
  for (const BarRow& r : spec.rows) {
    if (!std::isfinite(r.value)) continue;
    lo = std::min(lo, r.value);
    hi = std::max(hi, r.value);
  }
  if (!std::isfinite(lo)) lo = 0, hi = 1;
  if (!spec.from_lo) lo = std::min(lo, 0.0), hi = std::max(hi, 0.0);
  if (spec.lo) lo = *spec.lo;
  if (spec.hi) hi = *spec.hi;
  if (!(hi > lo)) hi = lo + 1;
  if (!spec.lo || !spec.hi) {  // round the free ends out to ticks
    const double step = tick_step(hi - lo, 6);
    if (!spec.lo) lo = std::floor(lo / step) * step;
    if (!spec.hi) hi = std::ceil(hi / step) * step;
  }
  const auto x_of = [&](double v) {
    if (v == INFINITY) return kX1;
    if (v == -INFINITY || std::isnan(v)) return kX0;
    return kX0 + (std::clamp(v, lo, hi) - lo) / (hi - lo) * (kX1 - kX0);
  };
  const double base = spec.from_lo ? kX0 : x_of(0);
  const double bottom = kTop + kRow * static_cast<double>(spec.rows.size());
  std::string s = svg_open("bar-chart", bottom + 44, spec.title);
  s += "<g class=\"bars\">";
  for (size_t i = 0; i < spec.rows.size(); ++i) {
    const BarRow& r = spec.rows[i];
    const double y = kTop + kRow * static_cast<double>(i);
    const double x = x_of(r.value);
    std::string css = "bar";
    if (!r.css_class.empty()) css += " " + r.css_class;
    if (std::isinf(r.value)) css += r.value > 0 ? " inf" : " neg-inf";
    s += "<rect " + class_attr(css) + " x=\"" + px(std::min(base, x)) + "\" y=\"" + px(y + 3) +
         "\" width=\"" + px(std::fabs(x - base)) + "\" height=\"12\"><title>" +
         escape_html(r.label + ": " + r.value_text) + "</title></rect>";
    s += text_el("label", kLabelRight, y + 13, "end", shorten_name(r.label, 48));
    s += text_el("value", std::max(base, x) + 4, y + 13, "start", r.value_text);
  }
  s += "</g>";
  s += "<g class=\"axis y-axis\">" + line_el("axis-line", base, kTop, base, bottom) + "</g>";
  s += x_axis(kX0, kX1, bottom, lo, hi, spec.axis_label, kTop);
  return s + "</svg>";
}

std::string histogram_svg(const HistogramChartSpec& spec) {
  constexpr double kX0 = 70, kX1 = kWidth - 20, kTop = 30 + 12 * 4, kBottom = kTop + 170;
  const double n = static_cast<double>(spec.bars.size());
  uint64_t most = 1;
  for (uint64_t c : spec.bars) most = std::max(most, c);
  const double log_most = std::log10(1.0 + static_cast<double>(most));
  const auto y_of = [&](double count) {
    return kBottom - std::log10(1.0 + count) / log_most * (kBottom - kTop);
  };
  const double range = spec.range > 0 ? spec.range : 1;
  const auto x_of = [&](double v) { return kX0 + std::clamp(v / range, 0.0, 1.0) * (kX1 - kX0); };
  std::string s = svg_open("histogram-chart", kBottom + 44, spec.title);
  s += "<g class=\"bars\">";
  const double w = (kX1 - kX0) / std::max(n, 1.0);
  for (size_t i = 0; i < spec.bars.size(); ++i) {
    const double y = y_of(static_cast<double>(spec.bars[i]));
    const double from = range * static_cast<double>(i) / n;
    const double to = range * static_cast<double>(i + 1) / n;
    s += "<rect class=\"bar\" x=\"" + px(kX0 + w * static_cast<double>(i)) + "\" y=\"" + px(y) +
         "\" width=\"" + px(w) + "\" height=\"" + px(kBottom - y) + "\"><title>" +
         number_general(from, 4) + " to " + number_general(to, 4) + ": " +
         std::to_string(spec.bars[i]) + "</title></rect>";
  }
  s += "</g>";
  // The count axis is logarithmic (log10(1 + count)): tails of a few values stay visible.
  s += "<g class=\"axis y-axis\">" + line_el("axis-line", kX0, kTop, kX0, kBottom);
  for (double t = 1; t <= static_cast<double>(most) * 1.0000001; t *= 10) {
    const double y = y_of(t);
    s += line_el("tick", kX0 - 5, y, kX0, y);
    s += text_el("tick-label", kX0 - 8, y + 4, "end", t < 1e4 ? number_fixed(t, 0)
                                                              : number_general(t, 2));
  }
  s += "<text class=\"axis-label\" x=\"14\" y=\"" + px((kTop + kBottom) / 2) +
       "\" text-anchor=\"middle\" transform=\"rotate(-90 14 " + px((kTop + kBottom) / 2) +
       ")\">values (log scale)</text></g>";
  s += x_axis(kX0, kX1, kBottom, 0, range, spec.x_label, kBottom);
  s += "<g class=\"thresholds\">";
  for (size_t i = 0; i < spec.markers.size(); ++i) {
    const Marker& m = spec.markers[i];
    const double x = x_of(m.value);
    const double label_y = 30 + 12 * static_cast<double>(i);
    std::string css = "threshold";
    if (!m.css_class.empty()) css += " " + m.css_class;
    s += "<g " + class_attr(css) + ">" + line_el("marker", x, label_y + 2, x, kBottom);
    s += text_el("marker-label", x > (kX0 + kX1) / 2 ? x - 4 : x + 4, label_y,
                 x > (kX0 + kX1) / 2 ? "end" : "start", m.label);
    s += "<title>" + escape_html(m.label) + "</title></g>";
  }
  s += "</g>";
  return s + "</svg>";
}

std::string curve_svg(const CurveChartSpec& spec) {
  constexpr double kX0 = 80, kX1 = kWidth - 30, kTop = 34, kBottom = 264;
  double xmax = 1, ylo = INFINITY, yhi = -INFINITY;
  for (const CurvePoint& p : spec.points) {
    xmax = std::max(xmax, p.x);
    if (std::isfinite(p.y)) {
      ylo = std::min(ylo, p.y);
      yhi = std::max(yhi, p.y);
    }
  }
  if (spec.target) {
    ylo = std::min(ylo, *spec.target);
    yhi = std::max(yhi, *spec.target);
  }
  if (!std::isfinite(ylo)) ylo = 0, yhi = 1;
  if (!(yhi > ylo)) ylo -= 0.5, yhi += 0.5;
  const double pad = (yhi - ylo) * 0.08;
  const double step = tick_step(yhi - ylo + 2 * pad, 5);
  ylo = std::floor((ylo - pad) / step) * step;
  yhi = std::ceil((yhi + pad) / step) * step;
  const auto x_of = [&](double x) { return kX0 + x / xmax * (kX1 - kX0); };
  const auto y_of = [&](double y) {
    if (!std::isfinite(y)) return y > 0 ? kTop : kBottom;
    return kBottom - (std::clamp(y, ylo, yhi) - ylo) / (yhi - ylo) * (kBottom - kTop);
  };
  std::string s = svg_open("curve-chart", kBottom + 44, spec.title);
  // The y axis: value ticks.
  s += "<g class=\"axis y-axis\">" + line_el("axis-line", kX0, kTop, kX0, kBottom);
  const std::vector<double> ticks = nice_ticks(ylo, yhi, 5);
  const double ystep = ticks.size() > 1 ? ticks[1] - ticks[0] : step;
  for (double t : ticks) {
    s += line_el("grid", kX0, y_of(t), kX1, y_of(t));
    s += line_el("tick", kX0 - 5, y_of(t), kX0, y_of(t));
    s += text_el("tick-label", kX0 - 8, y_of(t) + 4, "end", tick_text(t, ystep));
  }
  s += "<text class=\"axis-label\" x=\"14\" y=\"" + px((kTop + kBottom) / 2) +
       "\" text-anchor=\"middle\" transform=\"rotate(-90 14 " + px((kTop + kBottom) / 2) + ")\">" +
       escape_html(spec.y_label) + "</text></g>";
  s += x_axis(kX0, kX1, kBottom, 0, xmax, spec.x_label, kBottom, /*integers=*/true);
  if (spec.target) {
    const double y = y_of(*spec.target);
    s += "<g class=\"target\">";
    s += line_el("target-line", kX0, y, kX1, y);
    s += text_el("target-label", kX1, y - 5, "end", spec.target_label);
    s += "</g>";
  }
  std::string points;
  for (const CurvePoint& p : spec.points) {
    if (!points.empty()) points += ' ';
    points += px(x_of(p.x));
    points += ',';
    points += px(y_of(p.y));
  }
  s += "<polyline class=\"curve\" points=\"" + points + "\"/>";
  s += "<g class=\"points\">";
  for (const CurvePoint& p : spec.points) {
    s += "<circle class=\"point " + std::string(p.good ? "meets" : "misses") + "\" cx=\"" +
         px(x_of(p.x)) + "\" cy=\"" + px(y_of(p.y)) + "\" r=\"5\"><title>" + escape_html(p.label) +
         "</title></circle>";
  }
  return s + "</g></svg>";
}

}  // namespace qforge::report
