// ir/json_number.h: finite doubles as JSON numbers, non-finite ones as "inf", "-inf", "nan",
// at any depth, and read back.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include <nlohmann/json.hpp>

#include "ir/json_number.h"

using namespace qforge;
using Json = nlohmann::ordered_json;

namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
}  // namespace

TEST(JsonNumber, FiniteIsANumberNonFiniteIsAString) {
  EXPECT_EQ(json_number<Json>(1.5), Json(1.5));
  EXPECT_TRUE(json_number<Json>(1.5).is_number());
  EXPECT_EQ(json_number<Json>(kInf), Json("inf"));
  EXPECT_EQ(json_number<Json>(-kInf), Json("-inf"));
  EXPECT_EQ(json_number<Json>(kNaN), Json("nan"));
}

TEST(JsonNumber, EncodeRewritesEveryNonFiniteNumberAtAnyDepth) {
  Json j = {{"a", kInf},
            {"rows", Json::array({Json{{"sqnr_db", -kInf}, {"cosine", kNaN}},
                                  Json{{"sqnr_db", 12.5}, {"count", 3}}})},
            {"name", "inf"}};
  // What nlohmann writes on its own: null, losing the sign.
  EXPECT_EQ(Json(j).dump().find("\"a\":null") != std::string::npos, true);
  encode_nonfinite(j);
  EXPECT_EQ(j.dump(),
            R"({"a":"inf","rows":[{"sqnr_db":"-inf","cosine":"nan"},{"sqnr_db":12.5,"count":3}],)"
            R"("name":"inf"})");
}

TEST(JsonNumber, ReadsBackWhatItWrites) {
  for (double v : {0.0, -3.25, 1e300, kInf, -kInf}) {
    const auto back = json_to_number(json_number<Json>(v));
    ASSERT_TRUE(back.has_value()) << v;
    EXPECT_EQ(*back, v);
  }
  const auto nan = json_to_number(json_number<Json>(kNaN));
  ASSERT_TRUE(nan.has_value());
  EXPECT_TRUE(std::isnan(*nan));
  EXPECT_FALSE(json_to_number(Json()).has_value());
  EXPECT_FALSE(json_to_number(Json("exact")).has_value());
  EXPECT_EQ(*json_to_number(Json(7)), 7.0);
}
