#include "cli/inspect_bundle.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <fstream>
#include <map>
#include <set>

#include "importers/bundle/bundle_reader.h"
#include "ir/json_number.h"
#include "quant/calib/quant_error.h"

namespace qforge::cli {

namespace fs = std::filesystem;

namespace {

constexpr size_t kWorstLayers = 5;

int dtype_bits(const std::string& dtype) {
  if (dtype == "int4" || dtype == "uint4" || dtype == "i4" || dtype == "u4") return 4;
  if (dtype == "int8" || dtype == "uint8" || dtype == "i8" || dtype == "u8") return 8;
  return 0;
}

// Weights in the manifest's quantization list: count, bits, granularities and block sizes.
Json weights_summary(const nlohmann::json& tensors) {
  Json j;
  size_t weights = 0;
  size_t activations = 0;
  std::set<int> bits;
  std::set<std::string> dtypes;
  std::set<std::string> granularity;
  std::set<int64_t> block_sizes;
  for (const auto& t : tensors) {
    if (!t.is_object()) continue;
    const std::string kind = t.value("kind", "");
    if (kind == "activation") {
      ++activations;
      continue;
    }
    ++weights;
    const std::string dtype = t.value("dtype", "");
    dtypes.insert(dtype);
    if (const int b = dtype_bits(dtype)) bits.insert(b);
    granularity.insert(t.value("granularity", ""));
    if (t.contains("block_size") && t["block_size"].is_number_integer()) {
      block_sizes.insert(t["block_size"].get<int64_t>());
    }
  }
  j["weights"] = weights;
  j["activations"] = activations;
  j["bits"] = bits;
  j["dtypes"] = dtypes;
  j["granularity"] = granularity;
  j["block_sizes"] = block_sizes;
  return j;
}

// report.json: the passes (name and scalar stats: the options they ran with) and every
// per-tensor row with an SQNR, worst first.
void add_report(Json& j, const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  nlohmann::ordered_json report;
  try {
    report = nlohmann::ordered_json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    j["report_error"] = std::string("report.json is not valid JSON: ") + e.what();
    return;
  }
  Json passes = Json::array();
  std::vector<Json> layers;
  uint64_t before = 0;
  uint64_t after = 0;
  bool sizes = false;
  if (report.contains("passes") && report["passes"].is_array()) {
    for (const auto& pass : report["passes"]) {
      if (!pass.is_object() || !pass.contains("stats") || !pass["stats"].is_object()) continue;
      Json options = Json::object();
      for (const auto& [key, value] : pass["stats"].items()) {
        if (!value.is_array() && !value.is_object()) {
          options[key] = value;
          continue;
        }
        if (!value.is_array()) continue;
        for (const auto& row : value) {
          if (!row.is_object()) continue;
          if (row.contains("bytes_before") && row.contains("bytes_after") &&
              row["bytes_before"].is_number() && row["bytes_after"].is_number()) {
            before += row["bytes_before"].get<uint64_t>();
            after += row["bytes_after"].get<uint64_t>();
            sizes = true;
          }
          const auto sqnr = row.contains("sqnr_db") ? json_to_number(row["sqnr_db"]) : std::nullopt;
          if (!sqnr) continue;
          Json layer = {{"name", row.value("name", "?")},
                        {"pass", pass.value("pass", "?")},
                        {"sqnr_db", *sqnr}};
          if (row.contains("max_abs_error")) layer["max_abs_error"] = row["max_abs_error"];
          layers.push_back(std::move(layer));
        }
      }
      passes.push_back({{"pass", pass.value("pass", "?")}, {"options", options}});
    }
  }
  const auto row_of = [](const Json& l) {
    const Json& name = l["name"];
    return LayerErrorRow{name.is_string() ? name.get<std::string>() : name.dump(),
                         l["sqnr_db"].get<double>(), 1.0};
  };
  std::stable_sort(layers.begin(), layers.end(), [&row_of](const Json& a, const Json& b) {
    return ranks_worse(row_of(a), row_of(b));
  });
  j["passes"] = passes;
  Json err;
  err["layers"] = layers.size();
  if (!layers.empty()) {
    // The mean is over the layers with a finite SQNR: one exact layer would make it +inf.
    double sum = 0;
    size_t finite = 0;
    for (const auto& l : layers) {
      const double v = l["sqnr_db"].get<double>();
      if (std::isfinite(v)) {
        sum += v;
        ++finite;
      }
    }
    err["min_sqnr_db"] = layers.front()["sqnr_db"];
    err["mean_sqnr_db"] = finite > 0 ? Json(sum / static_cast<double>(finite)) : Json();
    err["max_sqnr_db"] = layers.back()["sqnr_db"];
  }
  Json worst = Json::array();  // exact layers are never among the worst
  for (size_t i = 0; i < layers.size() && worst.size() < kWorstLayers; ++i) {
    if (layers[i]["sqnr_db"].get<double>() != std::numeric_limits<double>::infinity()) {
      worst.push_back(layers[i]);
    }
  }
  err["worst"] = worst;
  j["layer_error"] = err;
  if (sizes) j["quantized_bytes"] = {{"before", before}, {"after", after}};
}

}  // namespace

Json describe_bundle(const fs::path& dir) {
  const VerifyResult v = verify_bundle(dir);
  const auto& m = v.manifest;
  Json j;
  j["file"] = dir.string();
  j["format"] = "qforge-bundle";
  j["version"] = m.value("version", 0);
  j["producer"] = m.value("producer", "");
  j["source"] = m.contains("source") ? Json(m["source"]) : Json(nullptr);
  j["verified"] = v.ok();
  if (!v.ok()) j["problem"] = v.first_problem();
  Json files = Json::array();
  for (const auto& f : v.files) {
    Json row = {{"name", f.name},
                {"size", f.size},
                {"sha256", f.sha256},
                {"state", std::string(bundle_file_state_name(f.state))}};
    if (!f.message.empty()) row["message"] = f.message;
    files.push_back(std::move(row));
  }
  j["files"] = files;
  const nlohmann::json quant = m.contains("quantization") && m["quantization"].is_object()
                                   ? m["quantization"]
                                   : nlohmann::json::object();
  j["scheme"] = quant.value("scheme", "none");
  j["calibration"] = m.contains("calibration") ? Json(m["calibration"]) : Json(nullptr);
  j["inputs"] = m.contains("inputs") ? Json(m["inputs"]) : Json::array();
  j["outputs"] = m.contains("outputs") ? Json(m["outputs"]) : Json::array();
  j["quantized"] =
      weights_summary(quant.contains("tensors") ? quant["tensors"] : nlohmann::json::array());
  const auto report = std::find_if(v.files.begin(), v.files.end(), [](const BundleFileStatus& f) {
    return f.name == "report.json";
  });
  if (report != v.files.end() && report->state == BundleFileState::Ok) {
    add_report(j, v.dir / "report.json");
  }
  return j;
}

namespace {

std::string text_of(const Json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); }

std::string list_text(const Json& list) {
  std::string s;
  for (const auto& x : list) s += (s.empty() ? "" : ", ") + text_of(x);
  return s.empty() ? "-" : s;
}

}  // namespace

void print_bundle_text(const Json& j) {
  std::printf("%s: qforge bundle v%lld, %s\n", j["file"].get<std::string>().c_str(),
              j["version"].get<long long>(), j["producer"].get<std::string>().c_str());
  if (j["source"].is_object()) {
    std::printf("  source %s (sha256 %s)\n", text_of(j["source"].value("path", Json(""))).c_str(),
                text_of(j["source"].value("sha256", Json(""))).c_str());
  }
  std::printf("  verification: %s\n", j["verified"].get<bool>()
                                          ? "ok (every file has its listed size and SHA-256)"
                                          : ("FAILED: " + j["problem"].get<std::string>()).c_str());
  for (const auto& f : j["files"]) {
    std::printf("  file %-20s %10s  %s  %s\n", f["name"].get<std::string>().c_str(),
                human_bytes(f["size"].get<uint64_t>()).c_str(),
                f["sha256"].get<std::string>().substr(0, 16).c_str(),
                f["state"].get<std::string>().c_str());
  }
  std::printf("  scheme %s\n", j["scheme"].get<std::string>().c_str());
  if (j["calibration"].is_object()) {
    std::printf("  calibration %s\n", text_of(j["calibration"].value("method", Json("?"))).c_str());
  }
  if (j.contains("passes")) {
    for (const auto& p : j["passes"]) {
      std::string line = "  pass " + p["pass"].get<std::string>();
      for (const auto& [k, v] : p["options"].items()) line += " " + k + "=" + text_of(v);
      std::printf("%s\n", line.c_str());
    }
  }
  for (const char* key : {"inputs", "outputs"}) {
    for (const auto& v : j[key]) {
      std::printf("  %s %s %s %s\n", key, text_of(v.value("name", Json("?"))).c_str(),
                  text_of(v.value("dtype", Json("?"))).c_str(),
                  text_of(v.value("shape", Json("?"))).c_str());
    }
  }
  const auto& q = j["quantized"];
  std::printf("  quantized: %zu weights (bits %s, %s, block size %s), %zu activations\n",
              q["weights"].get<size_t>(), list_text(q["bits"]).c_str(),
              list_text(q["granularity"]).c_str(), list_text(q["block_sizes"]).c_str(),
              q["activations"].get<size_t>());
  if (j.contains("quantized_bytes")) {
    std::printf("  quantized weights %s -> %s\n",
                human_bytes(j["quantized_bytes"]["before"].get<uint64_t>()).c_str(),
                human_bytes(j["quantized_bytes"]["after"].get<uint64_t>()).c_str());
  }
  if (j.contains("layer_error") && j["layer_error"]["layers"].get<size_t>() > 0) {
    const auto& e = j["layer_error"];
    const auto text = [](const Json& v) {
      return v.is_null() ? std::string("-") : sqnr_text(v.get<double>());
    };
    std::printf("  layer SQNR: %zu layers, min %s, mean %s, max %s; worst:\n",
                e["layers"].get<size_t>(), text(e["min_sqnr_db"]).c_str(),
                text(e["mean_sqnr_db"]).c_str(), text(e["max_sqnr_db"]).c_str());
    for (const auto& l : e["worst"]) {
      std::printf("    %s %s (%s)\n", l["name"].get<std::string>().c_str(),
                  text(l["sqnr_db"]).c_str(), l["pass"].get<std::string>().c_str());
    }
  }
}

}  // namespace qforge::cli
