#include "exporters/bundle/bundle_writer.h"

#include <algorithm>
#include <fstream>
#include <memory>
#include <set>
#include <unordered_map>
#include <vector>

#include <spdlog/spdlog.h>

#include "exporters/atomic_file.h"
#include "exporters/atomic_folder.h"
#include "exporters/calib_table_writer.h"
#include "exporters/onnx/onnx_exporter.h"
#include "exporters/safetensors/safetensors_writer.h"
#include "ir/error.h"
#include "ir/json_number.h"
#include "ir/sha256.h"
#include "qforge/version.h"

namespace qforge {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

void write_text_file(const fs::path& path, const std::string& text) {
  AtomicFile file(path);
  {
    std::ofstream out(file.temp_path(), std::ios::binary | std::ios::trunc);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    out.close();
    if (!out) fail_io("cannot write '" + path.string() + "'; is the disk full?");
  }
  file.commit();
}

json shape_json(const ValueInfo& v) {
  if (!v.shape) return nullptr;
  json dims = json::array();
  for (const auto& d : *v.shape) {
    if (d.value) {
      dims.push_back(*d.value);
    } else {
      dims.push_back(d.param.empty() ? std::string("?") : d.param);
    }
  }
  return dims;
}

json values_json(const Graph& graph, const std::vector<ValueInfo>& values, bool skip_inits) {
  json out = json::array();
  for (const auto& v : values) {
    if (skip_inits && graph.has_initializer(v.name)) continue;  // a default, not a feed
    out.push_back({{"name", v.name},
                   {"dtype", v.dtype ? json(std::string(dtype_name(*v.dtype))) : json(nullptr)},
                   {"shape", shape_json(v)}});
  }
  return out;
}

bool is_quantized_dtype(DType d) {
  return d == DType::I8 || d == DType::U8 || d == DType::I4 || d == DType::U4;
}

// Records the manifest lists: those read by DequantizeLinear (format version 1 has no field for
// another packing, so MatMulNBits weights stay out of it, as they always have), in the order of
// the nodes that read them, which is the order the model uses them whatever order the passes
// added them in.
std::vector<const QuantRecord*> listed_records(const Graph& graph) {
  std::unordered_map<std::string, size_t> position;
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    const auto& outputs = graph.nodes[i].outputs;
    if (!outputs.empty()) position.emplace(outputs[0], i);
  }
  std::vector<const QuantRecord*> listed;
  for (const QuantRecord& r : graph.quant_records()) {
    if (r.packing == QuantPacking::Onnx) listed.push_back(&r);
  }
  std::stable_sort(listed.begin(), listed.end(), [&](const QuantRecord* a, const QuantRecord* b) {
    return position.at(a->reader) < position.at(b->reader);
  });
  return listed;
}

// The tensors weights.safetensors holds, in graph order: every quantized initializer, and the
// scales and zero points of the listed records.
Graph bundle_weights(const Graph& graph) {
  std::set<std::string> wanted;
  for (const QuantRecord* r : listed_records(graph)) {
    wanted.insert(r->scale);
    if (!r->zero_point.empty()) wanted.insert(r->zero_point);
  }
  Graph weights;
  for (const auto& [name, t] : graph.initializers()) {
    if (is_quantized_dtype(t.dtype()) || wanted.count(name) != 0) weights.set_initializer(name, t);
  }
  return weights;
}

json manifest_json(const Graph& graph, const BundleInfo& info, const std::string& source_sha,
                   const json& files) {
  json m;
  m["format"] = std::string(kBundleFormat);
  m["version"] = kBundleFormatVersion;
  m["producer"] = std::string("qforge ") + kVersion;
  if (info.source_path.empty() && source_sha.empty()) {
    m["source"] = nullptr;  // a graph built in code
  } else {
    m["source"] = {{"path", info.source_path.generic_string()}, {"sha256", source_sha}};
  }
  m["inputs"] = values_json(graph, graph.inputs, true);
  m["outputs"] = values_json(graph, graph.outputs, false);
  m["quantization"] = {{"scheme", info.scheme},
                       {"activation_dtype", info.activation_dtype},
                       {"tensors", bundle_quantized_tensors(graph)}};
  std::string method = info.calibration_method;
  std::string digest = info.dataset_digest;
  if (info.calibration) {
    if (method.empty()) method = info.calibration->method;
    if (digest.empty()) digest = info.calibration->dataset_digest;
  }
  if (method.empty() && !info.calibration) {
    m["calibration"] = nullptr;
  } else {
    m["calibration"] = {{"method", method},
                        {"dataset_digest", digest.empty() ? json(nullptr) : json(digest)}};
  }
  m["accuracy"] = info.accuracy;
  m["files"] = files;
  return m;
}

}  // namespace

json bundle_quantized_tensors(const Graph& graph) {
  graph.check_quant_records();
  json out = json::array();
  for (const QuantRecord* r : listed_records(graph)) {
    json t = {{"name", r->name},
              {"kind", std::string(quant_kind_name(r->kind))},
              {"dtype", r->dtype ? json(std::string(dtype_name(*r->dtype))) : json(nullptr)},
              {"scale", r->scale},
              {"zero_point", r->zero_point.empty() ? json(nullptr) : json(r->zero_point)}};
    // One channel is listed as per-tensor: a single scale says the same either way.
    const Tensor* scale = graph.find_initializer(r->scale);
    const bool one_scale = scale == nullptr || (scale->numel() == 1 && scale->rank() <= 1);
    QuantGranularity granularity = r->granularity();
    if (granularity == QuantGranularity::PerChannel && one_scale) {
      granularity = QuantGranularity::PerTensor;
    }
    t["granularity"] = std::string(quant_granularity_name(granularity));
    if (granularity != QuantGranularity::PerTensor) t["axis"] = *r->axis;
    if (granularity == QuantGranularity::Blocked) t["block_size"] = r->block_size;
    out.push_back(std::move(t));
  }
  return out;
}

void write_bundle(const Graph& graph, const fs::path& dir_in, const BundleInfo& info) {
  graph.check_quant_records();  // before anything is written
  fs::path dir = dir_in;
  if (dir.filename().empty()) dir = dir.parent_path();  // "x.qfb/" names the folder x.qfb
  if (dir.extension() != ".qfb") {
    fail_usage("bundle path '" + dir.string() + "' must end in .qfb (e.g. model.qfb)");
  }
  const fs::path parent = dir.parent_path().empty() ? fs::path(".") : dir.parent_path();
  std::error_code ec;
  if (!fs::is_directory(parent, ec)) {
    fail_io("output folder '" + parent.string() + "' does not exist: create it first");
  }
  const bool exists = fs::symlink_status(dir, ec).type() != fs::file_type::not_found && !ec;
  if (exists && !info.overwrite) {
    fail_usage("bundle '" + dir.string() +
               "' already exists; remove it, choose another name, or ask to overwrite it");
  }
  std::string source_sha = info.source_sha256;
  if (source_sha.empty() && !info.source_path.empty()) {
    if (!fs::is_regular_file(info.source_path, ec)) {
      fail_io("source model '" + info.source_path.string() +
              "' cannot be read to record its digest; give its sha256 instead");
    }
    source_sha = sha256_file_hex(info.source_path, "source model '" + info.source_path.string() + "'");
  }

  AtomicFolder folder(dir, exists, "bundle");
  const fs::path& temp = folder.temp_path();

  export_onnx(graph, temp / "model.onnx");
  SafetensorsWriteOptions st;
  st.format = "";
  st.keep_metadata = false;
  export_safetensors(bundle_weights(graph), temp / "weights.safetensors", st);
  if (info.calibration) {
    write_text_file(temp / "calibration.cache",
                    tensorrt_calibration_cache(*info.calibration, info.trt_version));
  }
  json report = info.report.is_null() ? json::object() : info.report;
  encode_nonfinite(report);  // "inf", "-inf", "nan" (ir/json_number.h)
  write_text_file(temp / "report.json", report.dump(2) + "\n");

  // Every file written so far (the exporters may add some, e.g. ONNX external data), sorted.
  std::vector<fs::path> names;
  for (const auto& entry : fs::recursive_directory_iterator(temp)) {
    if (entry.is_regular_file()) names.push_back(entry.path().lexically_relative(temp));
  }
  std::sort(names.begin(), names.end());
  json files = json::array();
  for (const auto& name : names) {
    const fs::path full = temp / name;
    files.push_back({{"name", name.generic_string()},
                     {"size", fs::file_size(full)},
                     {"sha256", sha256_file_hex(full, "'" + full.string() + "'")}});
  }
  json manifest = manifest_json(graph, info, source_sha, files);
  encode_nonfinite(manifest);
  write_text_file(temp / "manifest.json", manifest.dump(2) + "\n");
  folder.commit();
  spdlog::info("wrote bundle '{}' ({} files)", dir.string(), names.size() + 1);
}

}  // namespace qforge
