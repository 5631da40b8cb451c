// PEFT adapter keys -> modules. A key is "<prefix><module>.<part>[.<adapter>][.weight|.bias]"
// with prefix "base_model.model." (or none), part one of lora_A, lora_B, lora_embedding_A,
// lora_embedding_B, lora_magnitude_vector. Any other key is a whole tensor the adapter
// replaces: modules_to_save copies, trained biases (bias="all"/"lora_only") and saved
// embedding layers ("<module>.base_layer.weight").
#include <algorithm>
#include <set>
#include <unordered_map>

#include "importers/lora/lora_adapter.h"
#include "importers/lora/lora_module_check.h"
#include "ir/error.h"

namespace qforge {

namespace {

enum class Part { A, B, BBias, EmbA, EmbB, Magnitude, Whole };

struct ParsedKey {
  Part part = Part::Whole;
  std::vector<std::string> module;  // components before the part (Whole: the target's)
  std::string adapter;              // adapter name inside the key, if any
};

std::vector<std::string> split(std::string_view s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    const size_t dot = s.find('.', start);
    out.emplace_back(s.substr(start, dot == std::string_view::npos ? dot : dot - start));
    if (dot == std::string_view::npos) return out;
    start = dot + 1;
  }
}

std::string join(const std::vector<std::string>& parts, size_t begin, size_t end) {
  std::string out;
  for (size_t i = begin; i < end; ++i) {
    if (i > begin) out += '.';
    out += parts[i];
  }
  return out;
}

std::optional<Part> part_of(const std::string& c) {
  if (c == "lora_A") return Part::A;
  if (c == "lora_B") return Part::B;
  if (c == "lora_embedding_A") return Part::EmbA;
  if (c == "lora_embedding_B") return Part::EmbB;
  if (c == "lora_magnitude_vector") return Part::Magnitude;
  return std::nullopt;
}

[[noreturn]] void fail_module(const std::string& where, const std::string& module,
                              std::string_view what) {
  fail_invalid(where + ": module '" + module + "' " + std::string(what));
}

[[noreturn]] void refuse_trainable_tokens(const std::string& key, const std::string& where) {
  fail_unsupported(where + ": key '" + key +
                   "' belongs to trainable tokens, which qforge does not merge; merge with PEFT");
}

[[noreturn]] void bad_key(const std::string& key, const std::string& where) {
  fail_invalid(where + ": key '" + key +
               "' is not a PEFT LoRA key (expected <module>.lora_A.weight and the like)");
}

ParsedKey parse_key(const std::string& key, const std::string& where) {
  std::vector<std::string> c = split(key);
  size_t begin = (c.size() > 2 && c[0] == "base_model" && c[1] == "model") ? 2 : 0;
  ParsedKey out;
  size_t i = c.size();
  while (i > begin && !part_of(c[i - 1])) --i;
  if (i == begin) {  // a whole tensor
    out.module.assign(c.begin() + static_cast<std::ptrdiff_t>(begin), c.end());
    return out;
  }
  const size_t at = i - 1;
  const Part part = *part_of(c[at]);
  const std::vector<std::string> rest(c.begin() + static_cast<std::ptrdiff_t>(at + 1), c.end());
  if (at == begin) bad_key(key, where);
  out.module.assign(c.begin() + static_cast<std::ptrdiff_t>(begin),
                    c.begin() + static_cast<std::ptrdiff_t>(at));
  const bool tail_param = !rest.empty() && (rest.back() == "weight" || rest.back() == "bias");
  if (part == Part::A || part == Part::B) {  // nn.Linear / nn.Conv: always a .weight or .bias
    if (!tail_param || rest.size() > 2 || (rest.back() == "bias" && part == Part::A))
      bad_key(key, where);
    out.part = rest.back() == "bias" ? Part::BBias : part;
    if (rest.size() == 2) out.adapter = rest[0];
  } else if (part == Part::EmbA || part == Part::EmbB) {  // nn.Parameter: no suffix
    if (rest.size() > 1) bad_key(key, where);
    out.part = part;
    if (rest.size() == 1) out.adapter = rest[0];
  } else {  // magnitude: saved without ".weight", loaded with it
    const size_t n = rest.size() - ((!rest.empty() && rest.back() == "weight") ? 1 : 0);
    if (n > 1 || (!rest.empty() && rest.back() == "bias")) bad_key(key, where);
    out.part = part;
    if (n == 1) out.adapter = rest[0];
  }
  return out;
}

// Target name of a whole tensor: drops the wrapper components PEFT adds around a module.
std::string whole_target(const std::vector<std::string>& c, const std::set<std::string>& adapters) {
  std::vector<std::string> kept;
  for (size_t i = 0; i < c.size(); ++i) {
    if (c[i] == "base_layer" || c[i] == "original_module") continue;
    if (c[i] == "modules_to_save") {
      if (i + 2 < c.size() && adapters.count(c[i + 1])) ++i;  // skip ".<adapter>"
      continue;
    }
    kept.push_back(c[i]);
  }
  return join(kept, 0, kept.size());
}

}  // namespace

LoraAdapter build_peft_adapter(const LoraConfig& config, const Graph& weights,
                               const std::string& where) {
  LoraAdapter adapter;
  adapter.format = LoraFormat::Peft;
  adapter.config = config;
  std::unordered_map<std::string, size_t> index;
  std::set<std::string> adapter_names = {"default"};
  std::set<std::string> names_in_keys;
  std::vector<std::pair<const std::string*, ParsedKey>> wholes;

  for (const auto& [key, tensor] : weights.initializers()) {
    if (key.find("token_adapter.") != std::string::npos ||
        key.find("trainable_tokens") != std::string::npos) {
      refuse_trainable_tokens(key, where);
    }
    ParsedKey parsed = parse_key(key, where);
    if (parsed.part == Part::Whole) {
      wholes.emplace_back(&key, std::move(parsed));
      continue;
    }
    if (!parsed.adapter.empty()) {
      names_in_keys.insert(parsed.adapter);
      adapter_names.insert(parsed.adapter);
    }
    const std::string module = join(parsed.module, 0, parsed.module.size());
    auto [it, added] = index.emplace(module, adapter.modules.size());
    if (added) {
      LoraModule m;
      m.name = module;
      const ModuleScaling s = resolve_module_scaling(config, module);
      m.r = s.r;
      m.alpha = s.alpha;
      m.scaling = s.scaling;
      m.r_from = s.r_from;
      m.alpha_from = s.alpha_from;
      adapter.modules.push_back(std::move(m));
    }
    LoraModule& m = adapter.modules[it->second];
    m.keys.push_back(key);
    const bool embedding_part = parsed.part == Part::EmbA || parsed.part == Part::EmbB;
    const bool linear_part =
        parsed.part == Part::A || parsed.part == Part::B || parsed.part == Part::BBias;
    if ((embedding_part && (!m.a.empty() || !m.b.empty()) && m.kind != LoraLayerKind::Embedding) ||
        (linear_part && m.kind == LoraLayerKind::Embedding)) {
      fail_module(where, module, "has both lora_A/B and lora_embedding_A/B keys");
    }
    Tensor* slot = nullptr;
    switch (parsed.part) {
      case Part::A:
        slot = &m.a;
        break;
      case Part::B:
        slot = &m.b;
        break;
      case Part::BBias:
        slot = &m.bias;
        break;
      case Part::EmbA:
        slot = &m.a;
        m.kind = LoraLayerKind::Embedding;
        break;
      case Part::EmbB:
        slot = &m.b;
        m.kind = LoraLayerKind::Embedding;
        break;
      case Part::Magnitude:
        slot = &m.magnitude;
        break;
      case Part::Whole:
        break;
    }
    if (!slot->empty()) {
      fail_module(where, module,
                  "has key '" + key +
                      "' twice (several adapters in one file?); save each adapter "
                      "on its own");
    }
    *slot = tensor;
  }
  if (names_in_keys.size() > 1) {
    fail_invalid(where + ": keys name several adapters (" + *names_in_keys.begin() + ", " +
                 *std::next(names_in_keys.begin()) + ", ...); save each adapter on its own");
  }
  for (auto& m : adapter.modules) {
    check_lora_module(m, where);
    if (!m.magnitude.empty() && !config.use_dora) {
      fail_invalid(where + ": module '" + m.name +
                   "' has lora_magnitude_vector but use_dora is false "
                   "in adapter_config.json; the config does not belong to these weights");
    }
    if (m.magnitude.empty() && config.use_dora) {
      fail_invalid(where + ": use_dora is true but module '" + m.name +
                   "' has no lora_magnitude_vector");
    }
    if (!m.bias.empty() && !config.lora_bias) {
      fail_invalid(where + ": module '" + m.name +
                   "' has lora_B.bias but lora_bias is false "
                   "in adapter_config.json; the config does not belong to these weights");
    }
    if (m.bias.empty() && config.lora_bias && m.kind != LoraLayerKind::Embedding) {
      fail_invalid(where + ": lora_bias is true but module '" + m.name + "' has no lora_B.bias");
    }
  }
  for (const auto& [key, parsed] : wholes) {
    adapter.replacements.push_back(
        {whole_target(parsed.module, adapter_names), *key, *weights.find_initializer(*key)});
  }
  if (adapter.modules.empty() && adapter.replacements.empty()) {
    fail_invalid(where + ": holds no LoRA tensors; is this the adapter's weights file?");
  }
  return adapter;
}

}  // namespace qforge
