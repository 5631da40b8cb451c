#pragma once
// The calibration methods: one table drives parsing, --help and validation, and the names
// written into calibration tables. Header-only, so that the table readers and writers
// (importers/, exporters/) share it without linking the quant layer.
#include <array>
#include <optional>
#include <string>
#include <string_view>

namespace qforge {

enum class CalibMethod { MinMax, Percentile, Entropy, Mse };

struct CalibMethodInfo {
  CalibMethod method;
  std::string_view name;
  std::string_view description;
};

inline constexpr std::array<CalibMethodInfo, 4> kCalibMethods = {{
    {CalibMethod::MinMax, "minmax", "largest |x| seen: never clips, coarsest steps"},
    {CalibMethod::Percentile, "percentile",
     "the |x| below which --percentile % of values lie (default 99.99)"},
    {CalibMethod::Entropy, "entropy",
     "least KL divergence between the 2048-bin histogram of |x| and its 128-level "
     "quantization (TensorRT's method), never clipping more than mse would; the default"},
    {CalibMethod::Mse, "mse", "least expected squared int8 quantization error over the histogram"},
}};

inline std::string_view calib_method_name(CalibMethod method) {
  for (const CalibMethodInfo& m : kCalibMethods) {
    if (m.method == method) return m.name;
  }
  return "?";
}

inline std::optional<CalibMethod> calib_method_from_name(std::string_view name) {
  for (const CalibMethodInfo& m : kCalibMethods) {
    if (m.name == name) return m.method;
  }
  return std::nullopt;
}

// "minmax, percentile, entropy or mse", for messages.
inline std::string calib_method_list() {
  std::string s;
  for (size_t i = 0; i < kCalibMethods.size(); ++i) {
    if (i > 0) s += i + 1 == kCalibMethods.size() ? " or " : ", ";
    s += kCalibMethods[i].name;
  }
  return s;
}

}  // namespace qforge
