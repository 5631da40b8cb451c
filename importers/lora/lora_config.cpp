#include "importers/lora/lora_config.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <nlohmann/json.hpp>

#include "ir/error.h"

namespace qforge {

namespace {

using Json = nlohmann::ordered_json;

struct Ctx {
  const std::string& where;
  [[noreturn]] void invalid(const std::string& what) const { fail_invalid(where + ": " + what); }
  [[noreturn]] void unsupported(const std::string& what) const {
    fail_unsupported(where + ": " + what);
  }
};

bool is_unset(const Json* v) {
  return v == nullptr || v->is_null() || (v->is_boolean() && !v->get<bool>()) ||
         ((v->is_array() || v->is_object() || v->is_string()) && v->empty());
}

const Json* field(const Json& j, const char* name) {
  const auto it = j.find(name);
  return it == j.end() ? nullptr : &*it;
}

bool get_bool(const Json& j, const char* name, bool fallback, const Ctx& ctx) {
  const Json* v = field(j, name);
  if (v == nullptr || v->is_null()) return fallback;
  if (!v->is_boolean()) ctx.invalid(std::string(name) + " must be true or false, not " + v->dump());
  return v->get<bool>();
}

std::string get_string(const Json& j, const char* name, const std::string& fallback,
                       const Ctx& ctx) {
  const Json* v = field(j, name);
  if (v == nullptr || v->is_null()) return fallback;
  if (!v->is_string()) ctx.invalid(std::string(name) + " must be a string, not " + v->dump());
  return v->get<std::string>();
}

int64_t positive_rank(const Json& v, const std::string& what, const Ctx& ctx) {
  if (!v.is_number_integer()) ctx.invalid(what + " must be a positive integer, not " + v.dump());
  const auto r = v.get<int64_t>();
  if (r <= 0) ctx.invalid(what + " must be a positive integer, not " + std::to_string(r));
  return r;
}

double finite_number(const Json& v, const std::string& what, const Ctx& ctx) {
  if (!v.is_number()) ctx.invalid(what + " must be a number, not " + v.dump());
  const double d = v.get<double>();
  if (!std::isfinite(d)) ctx.invalid(what + " must be finite");
  return d;
}

std::regex compile_pattern(const std::string& key, const char* table, const Ctx& ctx) {
  try {
    // Breadth-first matching (libstdc++'s __polynomial): a key with nested quantifiers cannot
    // make the match take exponential time; back-references are refused.
    return std::regex("(.*\\.)?(" + key + ")",
                      std::regex::ECMAScript | std::regex_constants::__polynomial);
  } catch (const std::regex_error& e) {
    ctx.invalid(std::string(table) + " key '" + key +
                "' is not a regular expression qforge reads (" + e.what() +
                "); write it without Python-only syntax");
  }
}

template <typename V, typename Get>
std::vector<LoraPattern<V>> get_patterns(const Json& j, const char* name, const Ctx& ctx, Get get) {
  std::vector<LoraPattern<V>> out;
  const Json* v = field(j, name);
  if (v == nullptr || v->is_null()) return out;
  if (!v->is_object()) ctx.invalid(std::string(name) + " must be an object, not " + v->dump());
  for (const auto& [key, value] : v->items()) {
    const std::string what = std::string(name) + "['" + key + "']";
    out.push_back({key, compile_pattern(key, name, ctx), get(value, what)});
  }
  return out;
}

std::vector<std::string> get_string_list(const Json& j, const char* name, const Ctx& ctx) {
  std::vector<std::string> out;
  const Json* v = field(j, name);
  if (v == nullptr || v->is_null()) return out;
  if (!v->is_array())
    ctx.invalid(std::string(name) + " must be a list of strings, not " + v->dump());
  for (const auto& item : *v) {
    if (!item.is_string()) ctx.invalid(std::string(name) + " holds a non-string " + item.dump());
    out.push_back(item.get<std::string>());
  }
  return out;
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

// init_lora_weights as text; refuses the initialisations that rewrote the base weights.
std::string check_init(const Json& j, const Ctx& ctx) {
  const Json* v = field(j, "init_lora_weights");
  if (v == nullptr || v->is_null()) return "true";
  if (v->is_boolean()) return v->get<bool>() ? "true" : "false";
  if (!v->is_string()) ctx.invalid("init_lora_weights must be true, false or a string");
  const std::string init = v->get<std::string>();
  std::string low = lower(init);
  if (low.starts_with("pissa") || low.starts_with("corda") || low == "olora" || low == "lora_ga") {
    ctx.unsupported("init_lora_weights='" + init +
                    "' changed the base weights when the adapter was created, so merging it into "
                    "the original base would be wrong; re-save it with PEFT's save_pretrained(..., "
                    "path_initial_model_for_weight_conversion=...) to get a plain LoRA adapter");
  }
  if (low == "loftq") {
    ctx.unsupported(
        "init_lora_weights='loftq' adapters belong to the LoftQ-quantized base they "
        "were initialised from, not to the original weights; merge them with PEFT "
        "against that base, or convert with path_initial_model_for_weight_conversion");
  }
  static constexpr std::array<std::string_view, 5> kKnown = {"gaussian", "eva", "orthogonal",
                                                             "mica", "true"};
  if (std::find(kKnown.begin(), kKnown.end(), low) == kKnown.end()) {
    ctx.invalid("init_lora_weights='" + init + "' is not a value PEFT 0.21 knows");
  }
  return low;
}

void refuse_variants(const Json& j, const Ctx& ctx) {
  struct Variant {
    const char* field;
    const char* what;
  };
  static constexpr std::array<Variant, 10> kVariants = {{
      {"velora_config", "VeLoRA"},
      {"alora_invocation_tokens", "aLoRA (activated LoRA cannot be merged)"},
      {"use_bdlora", "BD-LoRA"},
      {"arrow_config", "Arrow routing"},
      {"kasa_config", "KaSA"},
      {"monteclora_config", "MonteCLoRA"},
      {"use_qalora", "QALoRA"},
      {"target_parameters", "target_parameters (LoRA on bare nn.Parameters)"},
      {"trainable_token_indices", "trainable tokens"},
      {"megatron_config", "Megatron-sharded LoRA"},
  }};
  for (const auto& variant : kVariants) {
    if (!is_unset(field(j, variant.field))) {
      ctx.unsupported(std::string(variant.field) + " is set: " + variant.what +
                      " adapters are not merged by qforge; merge them with PEFT");
    }
  }
  if (!is_unset(field(j, "layer_replication"))) {
    ctx.unsupported(
        "layer_replication is set: the adapter was trained on a model with "
        "duplicated layers that the base checkpoint does not have; merge it with PEFT");
  }
}

bool pattern_matches(const std::regex& regex, const std::string& key, const char* table,
                     const std::string& module) {
  try {
    return std::regex_match(module, regex);
  } catch (const std::regex_error&) {
    fail_invalid(std::string(table) + " key '" + key +
                 "' is too complex to match against module '" + module + "'; simplify the pattern");
  }
}

}  // namespace

double lora_scaling(double alpha, int64_t r, bool use_rslora) {
  return use_rslora ? alpha / std::sqrt(static_cast<double>(r)) : alpha / static_cast<double>(r);
}

LoraConfig parse_lora_config(std::string_view json_text, const std::string& where) {
  const Ctx ctx{where};
  Json j;
  try {
    j = Json::parse(json_text.begin(), json_text.end());
  } catch (const Json::parse_error& e) {
    ctx.invalid("not valid JSON at byte " + std::to_string(e.byte) +
                "; re-save the adapter with PEFT's save_pretrained");
  } catch (const Json::exception& e) {  // e.g. a number out of range
    ctx.invalid(std::string("unreadable JSON (") + e.what() +
                "); re-save the adapter with PEFT's save_pretrained");
  }
  if (!j.is_object()) ctx.invalid("expected a JSON object");
  const Json* type = field(j, "peft_type");
  if (type == nullptr || !type->is_string()) {
    ctx.invalid("no peft_type string; is this a PEFT adapter folder?");
  }
  if (type->get<std::string>() != "LORA") {
    ctx.unsupported("peft_type is '" + type->get<std::string>() +
                    "'; qforge merges LORA adapters only");
  }
  refuse_variants(j, ctx);

  LoraConfig c;
  if (const Json* r = field(j, "r"); r != nullptr && !r->is_null())
    c.r = positive_rank(*r, "r", ctx);
  if (const Json* a = field(j, "lora_alpha"); a != nullptr && !a->is_null()) {
    c.lora_alpha = finite_number(*a, "lora_alpha", ctx);
  }
  c.use_rslora = get_bool(j, "use_rslora", false, ctx);
  c.fan_in_fan_out = get_bool(j, "fan_in_fan_out", false, ctx);
  c.use_dora = get_bool(j, "use_dora", false, ctx);
  c.lora_bias = get_bool(j, "lora_bias", false, ctx);
  c.bias = get_string(j, "bias", "none", ctx);
  if (c.bias != "none" && c.bias != "all" && c.bias != "lora_only") {
    ctx.invalid("bias must be 'none', 'all' or 'lora_only', not '" + c.bias + "'");
  }
  c.rank_pattern = get_patterns<int64_t>(
      j, "rank_pattern", ctx,
      [&](const Json& v, const std::string& w) { return positive_rank(v, w, ctx); });
  c.alpha_pattern = get_patterns<double>(
      j, "alpha_pattern", ctx,
      [&](const Json& v, const std::string& w) { return finite_number(v, w, ctx); });
  c.modules_to_save = get_string_list(j, "modules_to_save", ctx);
  if (const Json* t = field(j, "target_modules"); t != nullptr && t->is_string()) {
    c.target_modules_regex = t->get<std::string>();
  } else {
    c.target_modules = get_string_list(j, "target_modules", ctx);
  }
  c.init_lora_weights = check_init(j, ctx);
  c.base_model_name_or_path = get_string(j, "base_model_name_or_path", "", ctx);
  return c;
}

ModuleScaling resolve_module_scaling(const LoraConfig& config, const std::string& module) {
  ModuleScaling s{config.r, config.lora_alpha, 0.0, "r", "lora_alpha"};
  for (const auto& p : config.rank_pattern) {
    if (pattern_matches(p.regex, p.key, "rank_pattern", module)) {
      s.r = p.value;
      s.r_from = "rank_pattern['" + p.key + "']";
      break;
    }
  }
  for (const auto& p : config.alpha_pattern) {
    if (pattern_matches(p.regex, p.key, "alpha_pattern", module)) {
      s.alpha = p.value;
      s.alpha_from = "alpha_pattern['" + p.key + "']";
      break;
    }
  }
  s.scaling = lora_scaling(s.alpha, s.r, config.use_rslora);
  return s;
}

}  // namespace qforge
