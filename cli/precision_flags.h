#pragma once
// --precision REGEX=int4|int8|float (repeatable): the mixed-precision rules of a model folder's
// weight-only quantization (quant/weights/linear_precision.h), in the order given.
#include <string>
#include <string_view>
#include <vector>

#include "quant/weights/linear_precision.h"

namespace qforge::cli {

// One value: the text after the last '=' names the precision, the text before it is the regex.
// Throws Usage (one line naming the value) for a missing '=', an empty regex, an unknown
// precision or a regex that does not compile.
PrecisionRule parse_precision_rule(std::string_view text);
std::vector<PrecisionRule> parse_precision_rules(const std::vector<std::string>& values);

}  // namespace qforge::cli
