#include "quant/schemes.h"

namespace qforge {

std::string_view quant_scheme_name(QuantScheme scheme) {
  for (const auto& info : kQuantSchemes) {
    if (info.scheme == scheme) return info.name;
  }
  return "?";
}

std::string quant_schemes_help() {
  std::string text;
  for (const auto& info : kQuantSchemes) {
    text += "  ";
    text += info.name;
    text += ": ";
    text += info.description;
    text += "\n";
  }
  return text;
}

}  // namespace qforge
