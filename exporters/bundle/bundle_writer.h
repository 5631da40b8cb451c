#pragma once
// Writes an engine bundle: a folder NAME.qfb holding
//   model.onnx           the (QDQ) graph, as export_onnx writes it
//   weights.safetensors  every int8/uint8/int4/uint4 initializer and the scale and zero-point
//                        initializers of the records the manifest lists, under their graph names
//                        (4-bit ones as packed U8, low nibble first, with qforge.dtype metadata)
//   calibration.cache    TensorRT calibration cache, when a calibration table is given
//   report.json          the per-layer report, when given
//   manifest.json        format, version, producer, source digest, inputs and outputs,
//                        quantization per tensor (from the graph's quantized-tensor records,
//                        ir/quant_record.h), calibration, accuracy, and every other
//                        file with its size and SHA-256 (keys sorted: deterministic)
// Atomic: everything is written into `.NAME.qfb.tmp-<pid>` beside the target, flushed, and
// the folder renamed into place; on any error the temporary folder is removed and nothing is
// left behind. importers/bundle/bundle_reader.h reads and verifies it.
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "ir/graph.h"
#include "ir/calibration_table.h"

namespace qforge {

inline constexpr std::string_view kBundleFormat = "qforge-bundle";
inline constexpr int kBundleFormatVersion = 1;

struct BundleInfo {
  std::filesystem::path source_path;  // the model the bundle was made from (empty: "source" null)
  std::string source_sha256;          // its SHA-256 (hex); empty: computed from source_path
  std::string scheme = "none";        // quantization scheme name, e.g. "int8-weights"
  std::string activation_dtype = "f32";  // activations after conversion: f32, f16 or bf16
  // Calibration, when the graph was calibrated: method ("entropy", ...) and dataset digest.
  // Empty: taken from `calibration` when that is given, else the manifest says null.
  std::string calibration_method;
  std::string dataset_digest;
  std::optional<CalibrationTable> calibration;  // written as calibration.cache
  std::string trt_version = "8601";             // calibration cache header (trt_version_tag)
  nlohmann::json accuracy;                      // accuracy summary; null: none
  nlohmann::json report;                        // per-layer report -> report.json; null: {}
  bool overwrite = false;                       // replace an existing bundle at the target
};

// Throws Error: Internal when a quantized-tensor record contradicts the graph (nothing is
// written); Usage when `dir` exists and overwrite is off, or does not end in ".qfb"; IO when its
// parent folder is missing or a file cannot be written; InvalidInput for a graph or table that
// cannot be exported (the exporters' messages).
void write_bundle(const Graph& graph, const std::filesystem::path& dir, const BundleInfo& info);

// The manifest's "quantization.tensors" list for `graph`: one entry per quantized-tensor record
// read by a DequantizeLinear, in the order of those nodes, {name, kind ("weight"/"activation"),
// dtype, granularity ("per-tensor", "per-channel" with axis, "blocked" with axis and
// block_size), scale, zero_point or null}; a per-channel record with a single scale is listed
// per-tensor. Throws Error(Internal) when a record contradicts the graph.
nlohmann::json bundle_quantized_tensors(const Graph& graph);

}  // namespace qforge
