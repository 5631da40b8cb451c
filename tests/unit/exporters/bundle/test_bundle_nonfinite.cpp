// Non-finite figures in a bundle: report.json and manifest.json write them as "inf", "-inf",
// "nan" (ir/json_number.h), and `inspect` reads them back: exact layers are never among the
// worst, the all-zero one (-inf) leads, and the mean is over the finite figures.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "cli/inspect_bundle.h"
#include "tests/unit/exporters/bundle/bundle_test_util.h"

namespace qforge::testing {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

BundleInfo info_with_nonfinite(const TempDir& tmp) {
  BundleInfo info = sample_info(tmp);
  using nlohmann::json;
  const json rows = json::array({{{"name", "exact_w"}, {"sqnr_db", kInf}},
                                 {{"name", "w30"}, {"sqnr_db", 30.0}},
                                 {{"name", "zero_w"}, {"sqnr_db", -kInf}},
                                 {{"name", "w20"}, {"sqnr_db", 20.0}, {"max_abs_error", kNaN}}});
  const json pass = {{"pass", "weight-int8"}, {"stats", {{"tensors", rows}}}};
  info.report = {{"passes", json::array({pass})}};
  info.accuracy = {{"sqnr_db", kInf}};
  return info;
}

}  // namespace

TEST(BundleNonFinite, ReportAndManifestWriteTheStrings) {
  TempDir tmp;
  write_bundle(qdq_graph(), tmp / "m.qfb", info_with_nonfinite(tmp));
  const std::string text = read_bytes(tmp / "m.qfb" / "report.json");
  EXPECT_EQ(text.find("null"), std::string::npos) << text;
  const auto rows = read_json(tmp / "m.qfb" / "report.json")["passes"][0]["stats"]["tensors"];
  EXPECT_EQ(rows[0]["sqnr_db"], "inf");
  EXPECT_EQ(rows[1]["sqnr_db"], 30.0);
  EXPECT_EQ(rows[2]["sqnr_db"], "-inf");
  EXPECT_EQ(rows[3]["max_abs_error"], "nan");
  const std::string manifest = read_bytes(tmp / "m.qfb" / "manifest.json");
  EXPECT_NE(manifest.find("\"inf\""), std::string::npos) << manifest;
}

TEST(BundleNonFinite, InspectRanksTheLayersWorstFirstWithoutExactOnes) {
  TempDir tmp;
  write_bundle(qdq_graph(), tmp / "m.qfb", info_with_nonfinite(tmp));
  const cli::Json j = cli::describe_bundle(tmp / "m.qfb");
  const auto& e = j["layer_error"];
  EXPECT_EQ(e["layers"], 4);
  std::vector<std::string> worst;
  for (const auto& l : e["worst"]) worst.push_back(l["name"].get<std::string>());
  EXPECT_EQ(worst, (std::vector<std::string>{"zero_w", "w20", "w30"}));
  EXPECT_EQ(e["min_sqnr_db"].get<double>(), -kInf);
  EXPECT_EQ(e["max_sqnr_db"].get<double>(), kInf);
  EXPECT_EQ(e["mean_sqnr_db"].get<double>(), 25.0);
}

}  // namespace qforge::testing
