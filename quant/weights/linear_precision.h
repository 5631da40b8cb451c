#pragma once
// Mixed precision for a model folder's Linears, as data: a list of rules, each a regular
// expression over the module name ("model.layers.3.mlp.down_proj", the weight's name less
// ".weight") and the precision the modules it matches get. The first rule whose regex matches
// anywhere in the name (std::regex_search, ECMAScript) wins; a module no rule matches gets the
// default (the --quant scheme's). The CLI fills the list from `--precision REGEX=int4|int8|float`.
//
// Fused groups: engines run q/k/v (and gate/up) of one layer as one fused Linear and refuse
// parts of different schemes, so the modules of one group must get one precision
// (kFusedLinearGroups).
#include <array>
#include <cstdint>
#include <regex>
#include <string>
#include <string_view>
#include <vector>

namespace qforge {

enum class LinearPrecision { Int4, Int8, Float };

// "int4", "int8", "float".
std::string_view linear_precision_name(LinearPrecision p);
// 4, 8, or 0 for float.
int linear_precision_bits(LinearPrecision p);

struct PrecisionRule {
  std::string pattern;  // ECMAScript regex over the module name
  LinearPrecision precision = LinearPrecision::Int4;
};

// The last name components that one engine layer fuses; modules of one layer whose names differ
// only in these components share a precision.
inline constexpr std::array<std::array<std::string_view, 3>, 2> kFusedLinearGroups = {{
    {"q_proj", "k_proj", "v_proj"},
    {"gate_proj", "up_proj", ""},
}};

class PrecisionRules {
 public:
  // Throws Usage naming the rule when a pattern is not a regular expression.
  PrecisionRules(std::vector<PrecisionRule> rules, LinearPrecision fallback);

  // The precision of `module`; the index of the rule that chose it in `rule` (-1: the default).
  LinearPrecision of(std::string_view module, int* rule = nullptr) const;

  const std::vector<PrecisionRule>& rules() const { return rules_; }
  LinearPrecision fallback() const { return fallback_; }
  bool empty() const { return rules_.empty(); }

 private:
  std::vector<PrecisionRule> rules_;
  std::vector<std::regex> compiled_;
  LinearPrecision fallback_;
};

// The text a rule was given as: "REGEX=int8".
std::string precision_rule_text(const PrecisionRule& rule);

// The fused group key of a module ("model.layers.0.self_attn.{q_proj|k_proj|v_proj}"), or "" when
// its last component is in no group.
std::string fused_group_key(std::string_view module);

}  // namespace qforge
