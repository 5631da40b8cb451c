// qforge inspect FILE: what a model or checkpoint holds, as text or one JSON object.
#include <cstdio>
#include <map>

#include "cli/app.h"
#include "cli/inspect_adapter.h"
#include "cli/inspect_bundle.h"
#include "cli/inspect_gguf.h"
#include "cli/inspect_hf.h"
#include "importers/bundle/bundle_reader.h"
#include "importers/gguf/gguf_reader.h"
#include "ir/error.h"
#include "importers/load_model.h"
#include "importers/safetensors/safetensors_reader.h"

namespace qforge::cli {

namespace {

Json shape_json(const ValueInfo& v) {
  if (!v.shape) return nullptr;
  Json dims = Json::array();
  for (const auto& d : *v.shape) {
    if (d.value) {
      dims.push_back(*d.value);
    } else {
      dims.push_back(d.param.empty() ? Json("?") : Json(d.param));
    }
  }
  return dims;
}

Json values_json(const std::vector<ValueInfo>& values) {
  Json out = Json::array();
  for (const auto& v : values) {
    out.push_back({{"name", v.name},
                   {"dtype", v.dtype ? Json(std::string(dtype_name(*v.dtype))) : Json(nullptr)},
                   {"shape", shape_json(v)}});
  }
  return out;
}

Json describe(const std::string& file, const LoadedModel& loaded) {
  const Graph& g = loaded.graph;
  Json j;
  j["file"] = file;
  j["format"] = std::string(format_name(loaded.format));
  if (loaded.format == FileFormat::Onnx) {
    j["ir_version"] = g.model.ir_version;
    j["producer"] = g.model.producer_name + (g.model.producer_version.empty()
                                                 ? ""
                                                 : " " + g.model.producer_version);
  }
  Json opsets = Json::object();
  for (const auto& [domain, version] : g.opset_imports) {
    opsets[domain.empty() ? "ai.onnx" : domain] = version;
  }
  j["opsets"] = opsets;
  j["nodes"] = g.nodes.size();
  std::map<std::string, int64_t> histogram;
  for (const auto& n : g.nodes) {
    ++histogram[n.domain.empty() ? n.op_type : n.domain + "." + n.op_type];
  }
  j["op_histogram"] = histogram;
  std::map<std::string, std::pair<uint64_t, uint64_t>> by_dtype;  // count, bytes
  for (const auto& [name, t] : g.initializers()) {
    auto& [count, bytes] = by_dtype[std::string(dtype_name(t.dtype()))];
    count += t.numel();
    bytes += t.nbytes();
  }
  Json dtypes = Json::object();
  for (const auto& [dtype, cb] : by_dtype) {
    dtypes[dtype] = {{"count", cb.first}, {"bytes", cb.second}};
  }
  j["parameters"] = {{"tensors", g.initializers().size()},
                     {"count", g.parameter_count()},
                     {"bytes", g.parameter_bytes()},
                     {"by_dtype", dtypes}};
  j["inputs"] = values_json(g.inputs);
  j["outputs"] = values_json(g.outputs);
  Json meta = Json::object();
  for (const auto& [k, v] : g.metadata) meta[k] = v;
  j["metadata"] = meta;
  if (loaded.hf_config) j["hf"] = describe_hf_folder(loaded);
  if (g.nodes.empty()) {  // a weights-only file: list its tensors
    Json tensors = Json::array();
    for (const auto& [name, t] : g.initializers()) {
      tensors.push_back({{"name", name},
                         {"dtype", std::string(dtype_name(t.dtype()))},
                         {"shape", t.shape()},
                         {"bytes", t.nbytes()}});
    }
    j["tensors"] = tensors;
  }
  return j;
}

std::string dims_text(const Json& shape) {
  if (shape.is_null()) return "?";
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += shape[i].is_string() ? shape[i].get<std::string>() : shape[i].dump();
  }
  return s + "]";
}

void print_text(const Json& j) {
  std::printf("%s: %s\n", j["file"].get<std::string>().c_str(),
              j["format"].get<std::string>().c_str());
  if (j.contains("producer")) {
    std::printf("  ir_version %lld, producer %s\n", j["ir_version"].get<long long>(),
                j["producer"].get<std::string>().c_str());
  }
  for (const auto& [domain, version] : j["opsets"].items()) {
    std::printf("  opset %s %lld\n", domain.c_str(), version.get<long long>());
  }
  for (const char* key : {"inputs", "outputs"}) {
    for (const auto& v : j[key]) {
      std::printf("  %s %s %s %s\n", key, v["name"].get<std::string>().c_str(),
                  v["dtype"].is_null() ? "?" : v["dtype"].get<std::string>().c_str(),
                  dims_text(v["shape"]).c_str());
    }
  }
  if (j["nodes"].get<size_t>() > 0) {
    std::printf("  %zu nodes:", j["nodes"].get<size_t>());
    for (const auto& [op, count] : j["op_histogram"].items()) {
      std::printf(" %s %lld", op.c_str(), count.get<long long>());
    }
    std::printf("\n");
  }
  if (j.contains("hf")) print_hf_text(j["hf"]);
  const auto& p = j["parameters"];
  std::printf("  parameters: %llu in %llu tensors, %s\n", p["count"].get<unsigned long long>(),
              p["tensors"].get<unsigned long long>(), human_bytes(p["bytes"]).c_str());
  for (const auto& [dtype, cb] : p["by_dtype"].items()) {
    std::printf("    %-5s %llu, %s\n", dtype.c_str(), cb["count"].get<unsigned long long>(),
                human_bytes(cb["bytes"]).c_str());
  }
  if (j.contains("tensors")) {
    for (const auto& t : j["tensors"]) {
      std::printf("  %s %s %s %s\n", t["name"].get<std::string>().c_str(),
                  t["dtype"].get<std::string>().c_str(), dims_text(t["shape"]).c_str(),
                  human_bytes(t["bytes"]).c_str());
    }
  }
}

}  // namespace

void register_inspect(CLI::App& app, const GlobalOptions& global, RunFn& run) {
  auto* cmd = app.add_subcommand("inspect",
                                 "Show what a model, checkpoint, adapter or engine bundle holds");
  auto file = std::make_shared<std::string>();
  auto json = std::make_shared<bool>(false);
  cmd->add_option("FILE", *file,
                  "ONNX model, safetensors or torch checkpoint, Hugging Face model folder, "
                  "PEFT adapter, GGUF file, NAME.qfb bundle (verified: exit 3 when a file is "
                  "missing or modified)")
      ->required();
  cmd->add_flag("--json", *json, "Print one JSON object on stdout");
  cmd->footer("Examples:\n  qforge inspect calib_data/sample_cnn.onnx --json\n  qforge inspect "
              "Llama-3.2-1B/ (config.json + safetensors or pytorch_model.bin)\n  qforge inspect "
              "llama_w4/ (a compressed-tensors folder: format, bits, group size, symmetric, "
              "Linears quantized, modules left float)");
  cmd->callback([&global, &run, file, json] {
    run = [&global, file, json] {
      const bool as_json = global.json || *json;
      if (looks_like_bundle(*file)) {
        const Json j = describe_bundle(*file);
        if (as_json) {
          print_json(j);
        } else {
          print_bundle_text(j);
        }
        if (j["verified"].get<bool>()) return 0;
        std::fprintf(stderr, "qforge: error: bundle '%s' failed verification: %s\n",
                     file->c_str(), j["problem"].get<std::string>().c_str());
        return exit_code(ErrorCategory::InvalidInput);
      }
      if (gguf::looks_like_gguf(*file)) {  // GGUF (llama.cpp): cli/inspect_gguf.h
        const Json j = describe_gguf(*file);
        if (as_json) {
          print_json(j);
        } else {
          print_gguf_text(j);
        }
        return 0;
      }
      const FileFormat format = sniff_format(*file);
      const bool kohya = format == FileFormat::Safetensors &&
                         is_kohya_weights(import_safetensors(*file));
      if (format == FileFormat::PeftAdapter || kohya) {
        const Json j = describe_adapter(*file, load_lora_adapter(*file));
        if (as_json) {
          print_json(j);
        } else {
          print_adapter_text(j);
        }
        return 0;
      }
      const LoadedModel loaded = load_model(*file);
      const Json j = describe(*file, loaded);
      if (as_json) {
        print_json(j);
      } else {
        print_text(j);
      }
      return 0;
    };
  });
}

}  // namespace qforge::cli
