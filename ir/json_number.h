#pragma once
// How qforge writes a double into JSON, in every file and --json result: a finite value as a
// JSON number, a non-finite one as the string "inf", "-inf" or "nan" (JSON has no literal for
// them; Python's float() reads these strings back). README.md, "JSON output", documents it.
#include <cmath>
#include <limits>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace qforge {

// The JSON form of `v` (Json: nlohmann::json or nlohmann::ordered_json).
template <class Json>
Json json_number(double v) {
  if (std::isfinite(v)) return Json(v);
  if (std::isnan(v)) return Json("nan");
  return Json(v > 0 ? "inf" : "-inf");
}

// Rewrites every non-finite number inside `j` (at any depth) in that form, so that dump()
// writes no null in its place. Writers call it on what they write.
template <class Json>
void encode_nonfinite(Json& j) {
  if (j.is_number_float()) {
    const double v = j.template get<double>();
    if (!std::isfinite(v)) j = json_number<Json>(v);
  } else if (j.is_structured()) {
    for (auto& child : j) encode_nonfinite(child);
  }
}

// The double a value written as above stands for; none for anything else (null, text, ...).
template <class Json>
std::optional<double> json_to_number(const Json& j) {
  if (j.is_number()) return j.template get<double>();
  if (!j.is_string()) return std::nullopt;
  const std::string& s = j.template get_ref<const std::string&>();
  if (s == "inf") return std::numeric_limits<double>::infinity();
  if (s == "-inf") return -std::numeric_limits<double>::infinity();
  if (s == "nan") return std::numeric_limits<double>::quiet_NaN();
  return std::nullopt;
}

}  // namespace qforge
