#include "importers/calib_table_reader.h"

#include <bit>
#include <charconv>
#include <cmath>
#include <limits>
#include <map>
#include <string>

#include "importers/safetensors/strict_json.h"
#include "importers/torch/byte_io.h"
#include "ir/error.h"
#include "ir/mapped_file.h"
#include "ir/calib_methods.h"

namespace qforge {

using torch_detail::printable;
using torch_detail::quote;

namespace {

constexpr size_t kMaxFile = size_t{256} << 20;

// ---- TensorRT cache -------------------------------------------------------------------------

struct CacheAlgorithm {
  std::string_view name;
  std::string_view method;
};
constexpr CacheAlgorithm kCacheAlgorithms[] = {
    {"EntropyCalibration2", "entropy"},
    {"EntropyCalibration", "entropy"},
    {"MinMaxCalibration", "minmax"},
    {"LegacyCalibration", "percentile"},
};

[[noreturn]] void bad_line(std::string_view source, size_t line, const std::string& what) {
  fail_invalid("TensorRT calibration cache " + quote(source) + " line " + std::to_string(line) +
               ": " + what);
}

std::string_view header_method(std::string_view header, std::string_view source) {
  const std::string expected =
      "expected a 'TRT-<version>-<calibrator>' header such as TRT-8601-EntropyCalibration2";
  if (header.substr(0, 4) != "TRT-") bad_line(source, 1, expected);
  const size_t dash = header.find('-', 4);
  const std::string_view version = header.substr(4, dash == std::string_view::npos ? 0 : dash - 4);
  if (version.empty() || version.size() > 9 ||
      version.find_first_not_of("0123456789") != std::string_view::npos) {
    bad_line(source, 1, expected);
  }
  const std::string_view algorithm = header.substr(dash + 1);
  for (const CacheAlgorithm& a : kCacheAlgorithms) {
    if (a.name == algorithm) return a.method;
  }
  bad_line(source, 1,
           "calibrator " + quote(printable(algorithm)) +
               " is not one TensorRT writes (EntropyCalibration2, EntropyCalibration, "
               "MinMaxCalibration or LegacyCalibration)");
}

float parse_scale(std::string_view hex, std::string_view name, std::string_view source,
                  size_t line) {
  uint32_t bits = 0;
  const auto [end, ec] = std::from_chars(hex.data(), hex.data() + hex.size(), bits, 16);
  if (hex.empty() || hex.size() > 8 || ec != std::errc() || end != hex.data() + hex.size()) {
    bad_line(source, line,
             quote(printable(hex)) +
                 " is not 1 to 8 hex digits (the float32 bits "
                 "of the scale)");
  }
  const auto scale = std::bit_cast<float>(bits);
  if (!std::isfinite(scale) || std::signbit(scale)) {
    bad_line(source, line,
             "tensor " + quote(printable(name)) + " has scale " + std::string(hex) +
                 ", which is not a finite float >= 0");
  }
  return scale;
}

// ---- JSON -----------------------------------------------------------------------------------

using json = nlohmann::json;

[[noreturn]] void bad_field(std::string_view source, const std::string& what) {
  fail_invalid("calibration table " + quote(source) + ": " + what);
}

void expect_keys(const json& obj, std::initializer_list<std::string_view> keys,
                 std::string_view source, const std::string& where) {
  for (std::string_view k : keys) {
    if (!obj.contains(std::string(k))) bad_field(source, where + "lacks " + quote(k));
  }
  for (const auto& [k, v] : obj.items()) {
    bool known = false;
    for (std::string_view want : keys) known = known || want == k;
    if (!known) bad_field(source, where + "has an unknown key " + quote(printable(k)));
  }
}

float range_value(const json& t, const char* key, std::string_view source,
                  const std::string& name) {
  const json& v = t.at(key);
  if (!v.is_number()) {
    bad_field(source, "tensor " + quote(printable(name)) + ": " + quote(key) + " is not a number");
  }
  const double d = v.get<double>();
  // Values up to half a float ulp past FLT_MAX still round to it (the JSON writer prints
  // FLT_MAX as 3.4028235e38, which is such a value).
  const double limit = std::ldexp(2.0 - std::ldexp(1.0, -24), 127);
  if (!(std::fabs(d) < limit)) {
    bad_field(source, "tensor " + quote(printable(name)) + ": " + quote(key) + " is " +
                          std::to_string(d) + ", beyond float32");
  }
  return static_cast<float>(d);
}

}  // namespace

CalibrationTable parse_tensorrt_calibration_cache(std::string_view text, std::string_view source) {
  CalibrationTable table;
  std::map<std::string, size_t> first_line;
  size_t line_no = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line_no == 1) {
      table.method = header_method(line, source);
      continue;
    }
    if (line.empty()) bad_line(source, line_no, "is empty; each line holds 'tensor: hex'");
    const size_t split = line.rfind(": ");
    if (split == std::string_view::npos) {
      bad_line(source, line_no, "expected 'tensor: hex', found no ': '");
    }
    const std::string name(line.substr(0, split));
    if (name.empty()) bad_line(source, line_no, "has no tensor name before ': '");
    const float scale = parse_scale(line.substr(split + 2), name, source, line_no);
    const auto [it, added] = first_line.emplace(name, line_no);
    if (!added) {
      bad_line(source, line_no,
               "tensor " + quote(printable(name)) + " appears again (first on line " +
                   std::to_string(it->second) + ")");
    }
    const float amax = scale * 127.0f;
    if (!std::isfinite(amax)) {
      bad_line(source, line_no,
               "tensor " + quote(printable(name)) +
                   " has a scale so large "
                   "that amax = scale * 127 overflows float32");
    }
    table.ranges[name] = {amax, -amax, amax};
  }
  if (line_no == 0) bad_line(source, 1, "the file is empty");
  return table;
}

CalibrationTable parse_calibration_json(std::string_view text, std::string_view source) {
  json doc;
  try {
    doc = safetensors_detail::parse_strict_json(text, "calibration table " + quote(source), "key");
  } catch (const json::exception& e) {  // e.g. out_of_range.406: a number beyond double
    std::string what = e.what();
    what.erase(0, what.find("] ") == std::string::npos ? 0 : what.find("] ") + 2);
    fail_invalid("calibration table " + quote(source) + " is not valid JSON: " + what);
  }
  if (!doc.is_object()) bad_field(source, "the document is not a JSON object");
  expect_keys(doc, {"format", "version", "method", "dataset_digest", "samples", "tensors"}, source,
              "the document ");
  if (doc["format"] != "qforge-calibration") {
    bad_field(source, "'format' is not \"qforge-calibration\"");
  }
  if (!doc["version"].is_number_integer() || doc["version"].get<int64_t>() != 1) {
    fail_unsupported("calibration table " + quote(source) + " has version " +
                     doc["version"].dump() + "; this qforge reads version 1");
  }
  CalibrationTable table;
  if (!doc["method"].is_string() || !calib_method_from_name(doc["method"].get<std::string>())) {
    bad_field(source, "'method' is " + doc["method"].dump() + ", not " + calib_method_list());
  }
  table.method = doc["method"].get<std::string>();
  const json& digest = doc["dataset_digest"];
  if (!digest.is_string() ||
      (!digest.get<std::string>().empty() &&
       (digest.get<std::string>().size() != 64 ||
        digest.get<std::string>().find_first_not_of("0123456789abcdef") != std::string::npos))) {
    bad_field(source, "'dataset_digest' is not empty or 64 lowercase hex digits");
  }
  table.dataset_digest = digest.get<std::string>();
  if (!doc["samples"].is_number_integer() || doc["samples"].get<int64_t>() < 0) {
    bad_field(source, "'samples' is " + doc["samples"].dump() + ", not a count >= 0");
  }
  table.samples = doc["samples"].get<int64_t>();
  if (!doc["tensors"].is_object()) bad_field(source, "'tensors' is not an object");
  for (const auto& [name, t] : doc["tensors"].items()) {
    const std::string where = "tensor " + quote(printable(name)) + " ";
    if (name.empty()) bad_field(source, "a tensor has an empty name");
    if (!t.is_object()) bad_field(source, where + "is not an object");
    expect_keys(t, {"amax", "min", "max"}, source, where);
    TensorRange r;
    r.amax = range_value(t, "amax", source, name);
    r.min = range_value(t, "min", source, name);
    r.max = range_value(t, "max", source, name);
    if (r.amax < 0) bad_field(source, where + "has amax " + std::to_string(r.amax) + ", below 0");
    if (r.min > r.max) bad_field(source, where + "has min above max");
    table.ranges[name] = r;
  }
  return table;
}

CalibrationTable parse_calibration_table(std::string_view text, std::string_view source) {
  const size_t first = text.find_first_not_of(" \t\r\n");
  if (first != std::string_view::npos && text[first] == '{')
    return parse_calibration_json(text, source);
  if (text.substr(0, 4) == "TRT-") return parse_tensorrt_calibration_cache(text, source);
  fail_invalid(quote(source) +
               " is neither a qforge calibration table (JSON) nor a TensorRT "
               "calibration cache (first line TRT-<version>-<calibrator>)");
}

CalibrationTable read_calibration_table(const std::filesystem::path& path) {
  const auto file = MappedFile::open(path);
  if (file->size() > kMaxFile) {
    fail_io("calibration table " + quote(path.string()) + " is " + std::to_string(file->size()) +
            " bytes, over qforge's 256 MiB cap");
  }
  const std::string_view text(reinterpret_cast<const char*>(file->bytes().data()), file->size());
  return parse_calibration_table(text, path.string());
}

}  // namespace qforge
