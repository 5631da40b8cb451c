// The HTML report writer: names escaped wherever they land, one chart element per row or bar,
// the data block that no name can end, and the same bytes for the same data.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>

#include "exporters/report/html_report.h"
#include "exporters/report/html_text.h"
#include "exporters/report/report_data.h"
#include "exporters/report/svg_chart.h"
#include "ir/error.h"
#include "tests/unit/temp_dir.h"

namespace qforge::report {
namespace {

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// The text between the first `open` and the `close` after it.
std::string between(const std::string& text, const std::string& open, const std::string& close) {
  const size_t a = text.find(open);
  if (a == std::string::npos) return "";
  const size_t b = text.find(close, a + open.size());
  const size_t from = a + open.size();
  return text.substr(from, b == std::string::npos ? std::string::npos : b - from);
}

const std::string kNasty = "a<b>&\"c'</script><!--";

Json document() {
  Json hist_thresholds = Json::array();
  const char* methods[] = {"minmax", "percentile", "entropy", "mse"};
  const double amax[] = {4.0, 3.5, 3.0, 2.5};
  for (int i = 0; i < 4; ++i) {
    hist_thresholds.push_back(
        {{"method", methods[i]}, {"amax", amax[i]}, {"clipped_fraction", 0.01 * i}});
  }
  Json bars = Json::array();
  for (int i = 0; i < 128; ++i) bars.push_back(1000 - 7 * i);
  Json layers = Json::array();
  for (int i = 0; i < 5; ++i) {
    layers.push_back({{"name", "/layer" + std::to_string(i) + "/" + kNasty},
                      {"sqnr_db", 40.0 - 3 * i},
                      {"cosine", 1.0 - 0.001 * i},
                      {"max_abs_error", 0.01 * i}});
  }
  layers.push_back({{"name", "same"}, {"sqnr_db", "inf"}, {"cosine", 1.0}, {"max_abs_error", 0.0}});
  return {{"ok", true},
          {"command", "compare"},
          {"float", "float.onnx"},
          {"quantized", kNasty + ".onnx"},
          {"outputs", Json::array({{{"name", "logits"}, {"sqnr_db", 25.5}, {"cosine", 0.99}}})},
          {"layers", layers},
          {"histograms", Json::array({{{"name", kNasty},
                                       {"range", 4.0},
                                       {"bins", 2048},
                                       {"bars", bars},
                                       {"chosen", "entropy"},
                                       {"percentile", 99.99},
                                       {"thresholds", hist_thresholds}}})}};
}

TEST(HtmlText, EscapesMarkupCharacters) {
  EXPECT_EQ(escape_html(kNasty), "a&lt;b&gt;&amp;&quot;c&#39;&lt;/script&gt;&lt;!--");
  EXPECT_EQ(escape_script_json(R"({"n":"</script><!--&"})"),
            R"({"n":"\u003c/script\u003e\u003c!--\u0026"})");
}

TEST(HtmlText, NumbersReadBackExactly) {
  for (double v : {0.1, 1.0 / 3.0, 1e-300, -2.5e17, 0.30000001192092896}) {
    EXPECT_EQ(std::stod(number_exact(v)), v) << number_exact(v);
  }
  EXPECT_EQ(number_exact(INFINITY), "inf");
  EXPECT_EQ(number_exact(-INFINITY), "-inf");
  EXPECT_EQ(number_fixed(31.456, 2), "31.46");
  EXPECT_EQ(number_fixed(-0.0001, 2), "0.00");
  EXPECT_EQ(number_general(0.000123456, 3), "0.000123");
}

// Fixed notation of a large value runs past any small buffer (DBL_MAX has 309 digits before the
// point): the whole text, and nothing after it (the report fuzzer found garbage here).
TEST(HtmlText, LargeNumbersInFixedNotationAreWrittenWhole) {
  const std::string big = number_fixed(3.6666e96, 1);
  EXPECT_EQ(big.size(), 99u) << big;
  EXPECT_EQ(std::stod(big), 3.6666e96);
  EXPECT_EQ(big.substr(big.size() - 2), ".0");
  const std::string max = number_fixed(-std::numeric_limits<double>::max(), 2);
  EXPECT_EQ(max.size(), 1u + 309u + 3u) << max;
  EXPECT_EQ(std::stod(max), -std::numeric_limits<double>::max());
  EXPECT_EQ(number_fixed(3.6666e96, 1), big) << "the same bytes every time";
}

TEST(HtmlText, ShortensNamesFromTheFrontKeepingUtf8Whole) {
  EXPECT_EQ(shorten_name("short", 10), "short");
  EXPECT_EQ(shorten_name("/encoder/layer.3/output/dense/MatMul", 13),
            "\xE2\x80\xA6" "dense/MatMul");
  // "é" is two bytes: cutting never splits it.
  EXPECT_EQ(shorten_name("\xC3\xA9\xC3\xA9\xC3\xA9\xC3\xA9", 3), "\xE2\x80\xA6\xC3\xA9\xC3\xA9");
}

TEST(ReportData, RebinsHistogramsIntoEqualBars) {
  std::vector<uint64_t> bins(2048);
  for (size_t i = 0; i < bins.size(); ++i) bins[i] = i;
  const std::vector<uint64_t> bars = rebin_histogram(bins, 128);
  ASSERT_EQ(bars.size(), 128u);
  EXPECT_EQ(bars[0], 120u);  // 0 + 1 + ... + 15
  EXPECT_EQ(bars[127], 16u * 2032 + 120);
  uint64_t total = 0;
  for (uint64_t b : bars) total += b;
  EXPECT_EQ(total, 2047u * 2048 / 2);
  // Uneven: 10 bins into 3 bars of 3, 3 and 4.
  EXPECT_EQ(rebin_histogram({1, 1, 1, 1, 1, 1, 1, 1, 1, 1}, 3), (std::vector<uint64_t>{3, 3, 4}));
}

TEST(ReportData, ParsesTheBudgetTargetText) {
  const auto t = parse_budget_target("cosine >= 0.98, SQNR >= 20 dB, top-1 drop <= 0.3 points");
  ASSERT_EQ(t.size(), 3u);
  EXPECT_EQ(t[0].metric, "cosine");
  EXPECT_DOUBLE_EQ(t[0].value, 0.98);
  EXPECT_TRUE(t[0].at_least);
  EXPECT_EQ(t[1].metric, "sqnr_db");
  EXPECT_DOUBLE_EQ(t[1].value, 20);
  EXPECT_EQ(t[2].metric, "top1_drop");
  EXPECT_DOUBLE_EQ(t[2].value, 0.3);
  EXPECT_FALSE(t[2].at_least);
}

TEST(ReportData, SortsLayersWorstFirst) {
  const ReportData d = report_data_from_json(document(), "test");
  ASSERT_EQ(d.errors.size(), 1u);
  const auto& rows = d.errors[0].rows;
  ASSERT_EQ(rows.size(), 6u);
  EXPECT_DOUBLE_EQ(*rows[0].sqnr_db, 28.0);
  EXPECT_EQ(rows.back().name, "same");
  EXPECT_TRUE(std::isinf(*rows.back().sqnr_db));
}

TEST(ReportData, RefusesWrongTypesNamingThePath) {
  Json doc = document();
  doc["layers"][2]["sqnr_db"] = "loud";
  try {
    (void)report_data_from_json(doc, "'r.json'");
    FAIL() << "accepted a text SQNR";
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), ErrorCategory::InvalidInput);
    EXPECT_NE(std::string(e.what()).find("'r.json': layers[2].sqnr_db is not a number"),
              std::string::npos)
        << e.what();
  }
  Json bad_hist = document();
  bad_hist["histograms"][0]["bars"][5] = -1;
  EXPECT_THROW((void)report_data_from_json(bad_hist, "x"), Error);
  Json far = document();
  far["histograms"][0]["thresholds"][0]["amax"] = 9.0;  // beyond the histogram's range
  EXPECT_THROW((void)report_data_from_json(far, "x"), Error);
  EXPECT_THROW((void)report_data_from_json(Json::array(), "x"), Error);
  EXPECT_THROW((void)report_data_from_json(Json{{"passes", {{{"pass", 3}}}}}, "x"), Error);
}

TEST(HtmlReport, EscapesNamesEverywhere) {
  const std::string html = html_report(report_data_from_json(document(), "test"));
  // The raw name never appears; its escaped form does, in text and tooltips.
  EXPECT_EQ(html.find("a<b>"), std::string::npos);
  EXPECT_NE(html.find("a&lt;b&gt;&amp;&quot;c&#39;&lt;/script&gt;"), std::string::npos);
  // Two script elements (the data and the page's script), each closed once: no name ends one.
  EXPECT_EQ(count(html, "<script"), 2u);
  EXPECT_EQ(count(html, "</script"), 2u);
  EXPECT_EQ(count(html, "<!--"), 0u);
  // The data block is the document, with < > & as \u escapes: JSON that reads back the same.
  const std::string data = between(html, "id=\"qforge-report-data\">", "</script>");
  Json expected = document();
  expected["layers"][5]["sqnr_db"] = "inf";
  EXPECT_EQ(Json::parse(data), expected);
  // No network: nothing is loaded from elsewhere.
  EXPECT_EQ(html.find("http"), std::string::npos);
  EXPECT_EQ(html.find(" src="), std::string::npos);
}

TEST(HtmlText, CssTokenKeepsOnlyNameCharacters) {
  EXPECT_EQ(css_token("prec-int4_b32"), "prec-int4_b32");
  EXPECT_EQ(css_token(kNasty), "a-b---c---script-----");
  EXPECT_EQ(css_token("int4 block"), "int4-block");
}

// A method or precision name from the data lands in class attributes too (the threshold
// markers, the precision bars): it can neither leave the attribute nor open a comment.
TEST(HtmlReport, EscapesMethodAndPrecisionNamesInClasses) {
  Json doc = document();
  doc["histograms"][0]["thresholds"][3]["method"] = kNasty;
  doc["histograms"][0]["chosen"] = kNasty;
  const std::string html = html_report(report_data_from_json(doc, "test"));
  EXPECT_EQ(count(html, "<script"), 2u);
  EXPECT_EQ(count(html, "</script"), 2u);
  EXPECT_EQ(count(html, "<!--"), 0u);
  EXPECT_EQ(html.find("a<b>"), std::string::npos);
  EXPECT_NE(html.find("<g class=\"threshold a-b---c---script----- chosen\">"), std::string::npos);
}

TEST(HtmlReport, ChartsHaveTheirElements) {
  const std::string html = html_report(report_data_from_json(document(), "test"));
  // compare's layers: an SQNR chart and a cosine chart of 6 bars each; the histogram: 128 bars
  // and a marker per method.
  EXPECT_EQ(count(html, "<svg class=\"chart bar-chart\""), 2u);
  EXPECT_EQ(count(html, "<svg class=\"chart histogram-chart\""), 1u);
  const std::string sqnr_chart = between(html, "<svg class=\"chart bar-chart\"", "</svg>");
  EXPECT_EQ(count(sqnr_chart, "<rect class=\"bar"), 6u);
  EXPECT_EQ(count(sqnr_chart, "<rect class=\"bar inf\""), 1u);  // the identical value
  EXPECT_EQ(count(sqnr_chart, "<text class=\"label\""), 6u);
  EXPECT_EQ(count(sqnr_chart, "<g class=\"axis x-axis\">"), 1u);
  EXPECT_GE(count(sqnr_chart, "<text class=\"tick-label\""), 3u);
  const std::string hist = between(html, "<svg class=\"chart histogram-chart\"", "</svg>");
  EXPECT_EQ(count(hist, "<rect class=\"bar\""), 128u);
  EXPECT_EQ(count(hist, "<g class=\"threshold "), 4u);
  EXPECT_EQ(count(hist, "<g class=\"threshold entropy chosen\">"), 1u);
  EXPECT_EQ(count(hist, "<g class=\"axis y-axis\">"), 1u);
  // Tables: every layer, every method, every bar, with exact values in data-v.
  EXPECT_EQ(count(between(html, "data-table=\"errors-1\">", "</table>"), "<tr>"), 7u);
  const std::string thresholds = between(html, "data-table=\"hist-1-thresholds\">", "</table>");
  EXPECT_EQ(count(thresholds, "<tr>"), 5u);
  EXPECT_NE(thresholds.find("data-v=\"3.5\""), std::string::npos);
  EXPECT_EQ(count(between(html, "data-table=\"hist-1-bars\">", "</table>"), "<tr>"), 129u);
}

TEST(HtmlReport, BudgetChartsAndTables) {
  Json layers = Json::array();
  for (int i = 0; i < 4; ++i) {
    layers.push_back({{"name", "/conv" + std::to_string(i)},
                      {"precision", i == 0 ? "float" : "int8"},
                      {"sensitivity_rank", 4 - i},
                      {"alone", {{"cosine", 0.99 + 0.002 * i}, {"sqnr_db", 20.0 + i}}}});
  }
  const auto trial = [](const char* what, int kept, bool meets, double cosine, double sqnr) {
    return Json{{"trial", what}, {"kept", kept}, {"meets", meets}, {"cosine", cosine},
                {"sqnr_db", sqnr}};
  };
  Json search = Json::array({trial("top", 4, true, 1.0, 90.0),
                             trial("bottom", 0, false, 0.97, 15.0),
                             trial("greedy", 1, true, 0.985, 18.0)});
  const Json doc = {{"passes", Json::array({{{"pass", "budget"},
                                             {"stats", {{"target", "cosine >= 0.98"},
                                                        {"precision", "int8 3, float 1"},
                                                        {"final", trial("", 1, true, 0.985, 18.0)},
                                                        {"layers", layers},
                                                        {"search", search}}}}})}};
  const std::string html = html_report(report_data_from_json(doc, "test"));
  const std::string ranking = between(html, "<svg class=\"chart bar-chart\"", "</svg>");
  EXPECT_EQ(count(ranking, "<rect class=\"bar"), 4u);
  EXPECT_EQ(count(ranking, "<rect class=\"bar prec-float\""), 1u);
  // Rank order: /conv3 (rank 1) first.
  EXPECT_LT(ranking.find("/conv3"), ranking.find("/conv0"));
  const std::string curve = between(html, "<svg class=\"chart curve-chart\"", "</svg>");
  EXPECT_EQ(count(curve, "<circle class=\"point meets\""), 2u);
  EXPECT_EQ(count(curve, "<circle class=\"point misses\""), 1u);
  EXPECT_EQ(count(curve, "<g class=\"target\">"), 1u);
  EXPECT_NE(curve.find("target &gt;= 0.98"), std::string::npos);
  EXPECT_EQ(count(between(html, "data-table=\"budget-layers\">", "</table>"), "<tr>"), 5u);
  EXPECT_EQ(count(between(html, "data-table=\"budget-search\">", "</table>"), "<tr>"), 4u);
}

TEST(HtmlReport, SameDataSameBytes) {
  test::TempDir dir;
  write_html_report(report_data_from_json(document(), "test"), dir / "a.html");
  write_html_report(report_data_from_json(document(), "test"), dir / "b.html");
  const auto read = [](const std::filesystem::path& p) {
    std::ifstream in(p, std::ios::binary);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  };
  const std::string a = read(dir / "a.html");
  EXPECT_GT(a.size(), 10000u);
  EXPECT_EQ(a, read(dir / "b.html"));
  EXPECT_EQ(a, html_report(report_data_from_json(document(), "test")));
}

TEST(HtmlReport, WritesNothingIntoAMissingFolder) {
  test::TempDir dir;
  EXPECT_THROW(write_html_report(report_data_from_json(document(), "test"), dir / "no" / "r.html"),
               Error);
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
}

TEST(SvgChart, TicksAreRoundAndCoverTheRange) {
  EXPECT_EQ(nice_ticks(0, 1, 5), (std::vector<double>{0, 0.2, 0.4, 0.6, 0.8, 1}));
  const auto t = nice_ticks(-13, 47, 6);
  ASSERT_FALSE(t.empty());
  EXPECT_DOUBLE_EQ(t.front(), -10);
  EXPECT_DOUBLE_EQ(t.back(), 40);
  EXPECT_TRUE(nice_ticks(1, 1, 5).empty());
}

}  // namespace
}  // namespace qforge::report

namespace qforge::report {
namespace {

TEST(SvgChart, CurveCountsHaveWholeTicks) {
  CurveChartSpec spec;
  spec.title = "t";
  spec.x_label = "layers kept";
  spec.y_label = "cosine";
  spec.points = {{0, 0.9998, false, "bottom"}, {1, 1.0, true, "top"}};
  const std::string svg = curve_svg(spec);
  const std::string x_axis = between(svg, "<g class=\"axis x-axis\">", "</g>");
  EXPECT_EQ(count(x_axis, "<text class=\"tick-label\""), 2u);
  EXPECT_NE(x_axis.find(">0</text>"), std::string::npos);
  EXPECT_NE(x_axis.find(">1</text>"), std::string::npos);
}

}  // namespace
}  // namespace qforge::report
