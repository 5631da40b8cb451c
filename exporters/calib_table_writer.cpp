#include "exporters/calib_table_writer.h"

#include <bit>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <fstream>

#include <nlohmann/json.hpp>

#include "exporters/atomic_file.h"
#include "ir/error.h"

namespace qforge {

namespace {

std::string quote(std::string_view s) {
  std::string out = "'";
  out += s;
  out += "'";
  return out;
}

void check_range(const std::string& name, const TensorRange& r, std::string_view what) {
  if (name.empty()) fail_invalid(std::string(what) + ": a tensor has an empty name");
  if (!std::isfinite(r.amax) || r.amax < 0.0f) {
    fail_invalid(std::string(what) + ": tensor " + quote(name) + " has amax " +
                 std::to_string(r.amax) + "; it must be finite and >= 0");
  }
  if (!std::isfinite(r.min) || !std::isfinite(r.max)) {
    fail_invalid(std::string(what) + ": tensor " + quote(name) + " has a non-finite min or max");
  }
}

// The double that prints as the float's shortest round-trip decimal ("0.1", not
// "0.100000001490116"), so the JSON reads naturally and parses back to the same float.
double shortest(float f) {
  char buf[32];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, f);
  double d = 0.0;
  std::from_chars(buf, end, d);
  return ec == std::errc() ? d : static_cast<double>(f);
}

void write_text(const std::string& text, const std::filesystem::path& path, std::string_view what) {
  AtomicFile file(path);
  {
    std::ofstream out(file.temp_path(), std::ios::binary | std::ios::trunc);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    out.close();
    if (!out) fail_io("cannot write " + std::string(what) + " " + quote(path.string()));
  }
  file.commit();
}

}  // namespace

std::string trt_version_tag(int major, int minor, int patch) {
  if (major < 0 || minor < 0 || minor > 99 || patch < 0 || patch > 99) {
    fail_usage("TensorRT version " + std::to_string(major) + "." + std::to_string(minor) + "." +
               std::to_string(patch) + " is not a version; give MAJOR.MINOR.PATCH, e.g. 8.6.1");
  }
  const int tag =
      major >= 10 ? major * 10000 + minor * 100 + patch : major * 1000 + minor * 100 + patch;
  return std::to_string(tag);
}

std::string calibration_table_json(const CalibrationTable& table) {
  nlohmann::ordered_json doc;
  doc["format"] = kCalibrationFormat;
  doc["version"] = kCalibrationFormatVersion;
  doc["method"] = table.method;
  doc["dataset_digest"] = table.dataset_digest;
  doc["samples"] = table.samples;
  nlohmann::ordered_json tensors = nlohmann::ordered_json::object();
  for (const auto& [name, r] : table.ranges) {  // std::map: sorted by name
    check_range(name, r, "calibration table");
    nlohmann::ordered_json t;
    t["amax"] = shortest(r.amax);
    t["min"] = shortest(r.min);
    t["max"] = shortest(r.max);
    tensors[name] = std::move(t);
  }
  doc["tensors"] = std::move(tensors);
  try {
    return doc.dump(2) + "\n";
  } catch (const nlohmann::json::type_error&) {  // a name that is not UTF-8
    fail_invalid("calibration table: a tensor name is not valid UTF-8, which JSON cannot hold");
  }
}

std::string tensorrt_calibration_cache(const CalibrationTable& table,
                                       std::string_view trt_version) {
  if (trt_version.empty() || trt_version.size() > 9 ||
      trt_version.find_first_not_of("0123456789") != std::string_view::npos) {
    fail_usage("TensorRT version tag " + quote(trt_version) +
               " is not all digits (8.6.1 is 8601, 10.3.0 is 100300)");
  }
  std::string out = "TRT-";
  out += trt_version;
  out += table.method == "entropy" ? "-EntropyCalibration2\n" : "-MinMaxCalibration\n";
  for (const auto& [name, r] : table.ranges) {
    check_range(name, r, "TensorRT calibration cache");
    if (name.find_first_of("\r\n") != std::string::npos) {
      fail_invalid("TensorRT calibration cache: tensor " + quote(name) +
                   " has a line break in its name, which the cache's line format cannot hold");
    }
    char hex[16];
    std::snprintf(hex, sizeof hex, "%08x", std::bit_cast<uint32_t>(r.amax / 127.0f));
    out += name;
    out += ": ";
    out += hex;
    out += '\n';
  }
  return out;
}

void write_calibration_table_json(const CalibrationTable& table,
                                  const std::filesystem::path& path) {
  write_text(calibration_table_json(table), path, "calibration table");
}

void write_tensorrt_calibration_cache(const CalibrationTable& table,
                                      const std::filesystem::path& path,
                                      std::string_view trt_version) {
  write_text(tensorrt_calibration_cache(table, trt_version), path, "TensorRT calibration cache");
}

}  // namespace qforge
