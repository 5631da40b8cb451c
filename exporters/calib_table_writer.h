#pragma once
// Writes a CalibrationTable as qforge's JSON and as a TensorRT calibration cache. Output is
// deterministic (names sorted, floats in their shortest round-trip form) and written
// atomically (AtomicFile): a failed write leaves nothing behind.
//
// JSON: {"format": "qforge-calibration", "version": 1, "method": ..., "dataset_digest": ...,
//        "samples": ..., "tensors": {NAME: {"amax": ..., "min": ..., "max": ...}, ...}}
// TensorRT cache: a first line TRT-<version>-EntropyCalibration2 (method entropy) or
// TRT-<version>-MinMaxCalibration (the others), then one line per tensor, `NAME: HHHHHHHH`,
// the 8 lowercase hex digits of the float32 bits of amax / 127. TensorRT refuses a cache whose
// version is not its own: 8.6.1 is 8601, 10.3.0 is 100300 (trt_version_tag).
#include <filesystem>
#include <string>
#include <string_view>

#include "ir/calibration_table.h"

namespace qforge {

inline constexpr std::string_view kCalibrationFormat = "qforge-calibration";
inline constexpr int kCalibrationFormatVersion = 1;
inline constexpr std::string_view kDefaultTrtVersion = "8601";  // TensorRT 8.6.1

// The version TensorRT writes into its cache header: major * 1000 + minor * 100 + patch up
// to 9.x, major * 10000 + minor * 100 + patch from 10.0. Throws Usage for negative parts or a
// minor or patch above 99.
std::string trt_version_tag(int major, int minor, int patch);

// Throw Error(InvalidInput) naming the tensor for a non-finite or negative amax, a non-finite
// min or max, an empty name, and (cache only) a name holding a line break or a version that
// is not all digits.
std::string calibration_table_json(const CalibrationTable& table);
std::string tensorrt_calibration_cache(const CalibrationTable& table,
                                       std::string_view trt_version = kDefaultTrtVersion);

void write_calibration_table_json(const CalibrationTable& table, const std::filesystem::path& path);
void write_tensorrt_calibration_cache(const CalibrationTable& table,
                                      const std::filesystem::path& path,
                                      std::string_view trt_version = kDefaultTrtVersion);

}  // namespace qforge
