#include "cli/precision_flags.h"

#include <algorithm>
#include <iterator>
#include <regex>

#include "ir/error.h"

namespace qforge::cli {

namespace {

struct PrecisionName {
  std::string_view name;
  LinearPrecision precision;
};

constexpr PrecisionName kPrecisionNames[] = {
    {"int4", LinearPrecision::Int4},
    {"int8", LinearPrecision::Int8},
    {"float", LinearPrecision::Float},
};

}  // namespace

PrecisionRule parse_precision_rule(std::string_view text) {
  const std::string value(text);
  const size_t eq = text.rfind('=');
  if (eq == std::string_view::npos || eq == 0) {
    fail_usage("--precision '" + value +
               "': expected REGEX=int4|int8|float (a regex over module names such as "
               "model.layers.0.mlp.down_proj)");
  }
  PrecisionRule rule;
  rule.pattern = value.substr(0, eq);
  const std::string_view what = text.substr(eq + 1);
  const auto* found = std::find_if(std::begin(kPrecisionNames), std::end(kPrecisionNames),
                                   [&](const PrecisionName& p) { return p.name == what; });
  if (found == std::end(kPrecisionNames)) {
    fail_usage("--precision '" + value + "': '" + std::string(what) +
               "' is not a precision; use int4 (in blocks of --block-size), int8 (per output "
               "channel) or float");
  }
  rule.precision = found->precision;
  try {
    std::regex check(rule.pattern, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    fail_usage("--precision '" + value + "': '" + rule.pattern +
               "' is not a regular expression (" + e.what() + ")");
  }
  return rule;
}

std::vector<PrecisionRule> parse_precision_rules(const std::vector<std::string>& values) {
  std::vector<PrecisionRule> rules;
  rules.reserve(values.size());
  for (const std::string& v : values) rules.push_back(parse_precision_rule(v));
  return rules;
}

}  // namespace qforge::cli
