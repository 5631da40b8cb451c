#pragma once
// Reads calibration ranges back (--import-calib): qforge's JSON or a TensorRT calibration cache,
// told apart by their first bytes. Strict: every malformed line or field is a one-line
// Error(InvalidInput) naming the file and the line or tensor.
//
// A TensorRT cache line is `NAME: HEX`, split at the last ": " (names such as onnx::MatMul_7
// hold colons); HEX is the float32 bits of the scale (up to 8 digits: TensorRT does not pad),
// amax = scale * 127, and min / max are -amax / amax since the cache holds no more. Its header
// gives the method: EntropyCalibration2 / EntropyCalibration -> entropy, MinMaxCalibration ->
// minmax, LegacyCalibration (a quantile cut) -> percentile. samples is 0 and dataset_digest "".
#include <filesystem>
#include <string_view>

#include "ir/calibration_table.h"

namespace qforge {

// Throws Error(IO) when the file cannot be read or is over 256 MiB.
CalibrationTable read_calibration_table(const std::filesystem::path& path);

// In-memory entry points; `source` names the text in messages.
CalibrationTable parse_calibration_table(std::string_view text, std::string_view source);
CalibrationTable parse_calibration_json(std::string_view text, std::string_view source);
CalibrationTable parse_tensorrt_calibration_cache(std::string_view text, std::string_view source);

}  // namespace qforge
