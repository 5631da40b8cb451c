// Kohya (sd-scripts) LoRA files: "<flat name>.lora_down.weight" [r, in, k...],
// "<flat name>.lora_up.weight" [out, r, 1...], "<flat name>.alpha" (a scalar). The flat name is
// the module path with '.' replaced by '_' behind a "lora_unet_" / "lora_te_" prefix.
// Scaling is alpha / r; a missing alpha means alpha = r (scale 1), as sd-scripts does.
#include <array>
#include <unordered_map>

#include "importers/lora/lora_adapter.h"
#include "importers/lora/lora_module_check.h"
#include "ir/error.h"

namespace qforge {

namespace {

constexpr std::string_view kDown = ".lora_down.weight";
constexpr std::string_view kUp = ".lora_up.weight";
constexpr std::string_view kAlpha = ".alpha";

bool ends_with(std::string_view s, std::string_view suffix) { return s.ends_with(suffix); }

[[noreturn]] void fail_key(ErrorCategory category, const std::string& where, const std::string& key,
                           std::string_view what) {
  fail(category, where + ": key '" + key + "' " + std::string(what));
}

void refuse_other_formats(const std::string& key, const std::string& where) {
  struct Marker {
    std::string_view text;
    std::string_view what;
  };
  static constexpr std::array<Marker, 6> kMarkers = {{
      {".dora_scale", "Kohya DoRA (dora_scale)"},
      {".hada_", "LyCORIS LoHa"},
      {".lokr_", "LyCORIS LoKr"},
      {".lora_mid.", "LoCon with a Tucker middle factor (lora_mid)"},
      {".diff", "full weight differences (diff)"},
      {".oft_", "OFT"},
  }};
  for (const auto& m : kMarkers) {
    if (key.find(m.text) != std::string::npos) {
      fail_key(ErrorCategory::Unsupported, where, key,
               "is " + std::string(m.what) +
                   ", which qforge does not merge; convert it to plain LoRA or merge it with its "
                   "trainer");
    }
  }
  fail_invalid(
      where + ": key '" + key +
      "' is not a Kohya LoRA key (expected <name>.lora_down.weight, .lora_up.weight, .alpha)");
}

}  // namespace

bool is_kohya_weights(const Graph& weights) {
  for (const auto& [key, tensor] : weights.initializers()) {
    if (ends_with(key, kDown) || ends_with(key, kUp)) return true;
  }
  return false;
}

LoraAdapter build_kohya_adapter(const Graph& weights, const std::string& where) {
  LoraAdapter adapter;
  adapter.format = LoraFormat::Kohya;
  std::unordered_map<std::string, size_t> index;
  std::unordered_map<std::string, const Tensor*> alphas;
  auto module_for = [&](const std::string& name) -> LoraModule& {
    auto [it, added] = index.emplace(name, adapter.modules.size());
    if (added) {
      LoraModule m;
      m.name = name;
      adapter.modules.push_back(std::move(m));
    }
    return adapter.modules[it->second];
  };
  for (const auto& [key, tensor] : weights.initializers()) {
    if (ends_with(key, kDown) || ends_with(key, kUp)) {
      const bool down = ends_with(key, kDown);
      const std::string name = key.substr(0, key.size() - (down ? kDown.size() : kUp.size()));
      LoraModule& m = module_for(name);
      (down ? m.a : m.b) = tensor;
      m.keys.push_back(key);
    } else if (ends_with(key, kAlpha)) {
      alphas[key.substr(0, key.size() - kAlpha.size())] = &tensor;
    } else {
      refuse_other_formats(key, where);
    }
  }
  for (const auto& [name, tensor] : alphas) {
    if (!index.count(name)) {
      fail_key(ErrorCategory::InvalidInput, where, name + ".alpha",
               "has no lora_down/lora_up beside it");
    }
    if (tensor->numel() != 1 || !dtype_is_float(tensor->dtype())) {
      fail_key(ErrorCategory::InvalidInput, where, name + ".alpha",
               "must be one floating-point number, not " +
                   std::string(dtype_name(tensor->dtype())) + " " +
                   shape_to_string(tensor->shape()));
    }
  }
  for (auto& m : adapter.modules) {
    m.r = m.a.empty() ? 0 : m.a.shape().at(0);
    m.r_from = "lora_down rows";
    const auto alpha = alphas.find(m.name);
    if (alpha != alphas.end()) {
      m.alpha = alpha->second->to_f32()[0];
      m.alpha_from = m.name + ".alpha";
      m.keys.push_back(m.name + ".alpha");
    } else {
      m.alpha = static_cast<double>(m.r);
      m.alpha_from = "r (no alpha key)";
    }
    check_lora_module(m, where);
    m.scaling = lora_scaling(m.alpha, m.r, false);
  }
  if (adapter.modules.empty()) fail_invalid(where + ": holds no LoRA tensors");
  return adapter;
}

}  // namespace qforge
