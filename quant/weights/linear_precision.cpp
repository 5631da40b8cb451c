#include "quant/weights/linear_precision.h"

#include "ir/error.h"

namespace qforge {

std::string_view linear_precision_name(LinearPrecision p) {
  switch (p) {
    case LinearPrecision::Int4:
      return "int4";
    case LinearPrecision::Int8:
      return "int8";
    case LinearPrecision::Float:
      return "float";
  }
  return "?";
}

int linear_precision_bits(LinearPrecision p) {
  return p == LinearPrecision::Int4 ? 4 : p == LinearPrecision::Int8 ? 8 : 0;
}

std::string precision_rule_text(const PrecisionRule& rule) {
  return rule.pattern + "=" + std::string(linear_precision_name(rule.precision));
}

PrecisionRules::PrecisionRules(std::vector<PrecisionRule> rules, LinearPrecision fallback)
    : rules_(std::move(rules)), fallback_(fallback) {
  compiled_.reserve(rules_.size());
  for (const PrecisionRule& r : rules_) {
    try {
      compiled_.emplace_back(r.pattern, std::regex::ECMAScript);
    } catch (const std::regex_error& e) {
      fail_usage("--precision '" + precision_rule_text(r) + "': '" + r.pattern +
                 "' is not a regular expression (" + e.what() + ")");
    }
  }
}

LinearPrecision PrecisionRules::of(std::string_view module, int* rule) const {
  const std::string name(module);
  for (size_t i = 0; i < compiled_.size(); ++i) {
    if (std::regex_search(name, compiled_[i])) {
      if (rule != nullptr) *rule = static_cast<int>(i);
      return rules_[i].precision;
    }
  }
  if (rule != nullptr) *rule = -1;
  return fallback_;
}

std::string fused_group_key(std::string_view module) {
  const size_t dot = module.rfind('.');
  const std::string_view last = dot == std::string_view::npos ? module : module.substr(dot + 1);
  for (const auto& group : kFusedLinearGroups) {
    for (std::string_view member : group) {
      if (member.empty() || member != last) continue;
      std::string key(module.substr(0, dot == std::string_view::npos ? 0 : dot + 1));
      key += "{";
      for (std::string_view m : group) {
        if (m.empty()) continue;
        if (key.back() != '{') key += "|";
        key += m;
      }
      return key + "}";
    }
  }
  return {};
}

}  // namespace qforge
