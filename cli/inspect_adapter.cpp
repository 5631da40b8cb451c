// What `qforge inspect` shows of a LoRA adapter: its settings and, per adapted module, the
// layer kind, rank, alpha, scaling and whether DoRA or a LoRA bias is present.
#include <cstdio>

#include "cli/app.h"
#include "cli/inspect_adapter.h"

namespace qforge::cli {

Json describe_adapter(const std::string& file, const LoraAdapter& adapter) {
  const LoraConfig& c = adapter.config;
  Json j;
  j["file"] = file;
  j["format"] = adapter.format == LoraFormat::Peft ? "peft-adapter" : "kohya-lora";
  j["r"] = c.r;
  j["lora_alpha"] = c.lora_alpha;
  j["use_rslora"] = c.use_rslora;
  j["use_dora"] = c.use_dora;
  j["fan_in_fan_out"] = c.fan_in_fan_out;
  j["lora_bias"] = c.lora_bias;
  j["target_modules"] = c.target_modules_regex.empty() ? Json(c.target_modules)
                                                       : Json(c.target_modules_regex);
  j["modules_to_save"] = c.modules_to_save;
  j["base_model"] = c.base_model_name_or_path;
  uint64_t count = 0;
  uint64_t bytes = 0;
  Json modules = Json::array();
  for (const auto& m : adapter.modules) {
    for (const Tensor* t : {&m.a, &m.b, &m.bias, &m.magnitude}) {
      count += t->numel();
      bytes += t->nbytes();
    }
    modules.push_back({{"module", m.name},
                       {"kind", std::string(lora_layer_kind_name(m.kind))},
                       {"in_features", m.in_features()},
                       {"out_features", m.out_features()},
                       {"r", m.r},
                       {"alpha", m.alpha},
                       {"scaling", m.scaling},
                       {"dora", !m.magnitude.empty()},
                       {"bias", !m.bias.empty()},
                       {"dtype", std::string(dtype_name(m.a.dtype()))}});
  }
  Json replacements = Json::array();
  for (const auto& r : adapter.replacements) {
    count += r.tensor.numel();
    bytes += r.tensor.nbytes();
    replacements.push_back({{"target", r.target}, {"key", r.key}});
  }
  j["modules"] = modules;
  j["replacements"] = replacements;
  j["parameters"] = {{"count", count}, {"bytes", bytes}};
  return j;
}

void print_adapter_text(const Json& j) {
  std::printf("%s: %s, r %lld, alpha %g%s%s%s, %zu modules, %zu replaced tensors, %s\n",
              j["file"].get<std::string>().c_str(), j["format"].get<std::string>().c_str(),
              j["r"].get<long long>(), j["lora_alpha"].get<double>(),
              j["use_rslora"].get<bool>() ? ", rsLoRA" : "", j["use_dora"].get<bool>() ? ", DoRA" : "",
              j["fan_in_fan_out"].get<bool>() ? ", fan_in_fan_out" : "", j["modules"].size(),
              j["replacements"].size(), human_bytes(j["parameters"]["bytes"]).c_str());
  for (const auto& m : j["modules"]) {
    std::printf("  %s %s [%lld -> %lld] r %lld alpha %g scaling %g%s%s\n",
                m["module"].get<std::string>().c_str(), m["kind"].get<std::string>().c_str(),
                m["in_features"].get<long long>(), m["out_features"].get<long long>(),
                m["r"].get<long long>(), m["alpha"].get<double>(), m["scaling"].get<double>(),
                m["dora"].get<bool>() ? " DoRA" : "", m["bias"].get<bool>() ? " +bias" : "");
  }
  for (const auto& r : j["replacements"]) {
    std::printf("  replaces %s\n", r["target"].get<std::string>().c_str());
  }
}

}  // namespace qforge::cli
