#include "importers/hf/hf_decoder_facts.h"

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "ir/error.h"

namespace qforge {

namespace {

std::string rope_type_of(const nlohmann::json& obj) {
  if (!obj.is_object()) return {};
  for (const char* key : {"rope_type", "type"}) {
    if (const auto it = obj.find(key); it != obj.end() && it->is_string()) {
      return it->get<std::string>();
    }
  }
  return {};
}

}  // namespace

HfDecoderFacts parse_hf_decoder_facts(const std::string& config_json, const std::string& file) {
  const auto j = nlohmann::json::parse(config_json, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) fail_invalid("'" + file + "' is not a JSON object");
  HfDecoderFacts f;
  if (const auto it = j.find("rms_norm_eps"); it != j.end() && !it->is_null()) {
    if (!it->is_number()) {
      fail_invalid("'" + file + "': \"rms_norm_eps\" is " + it->dump() + ", expected a number");
    }
    f.rms_norm_eps = it->get<double>();
  }
  if (const auto it = j.find("head_dim"); it != j.end() && !it->is_null()) f.head_dim_given = true;
  if (const auto it = j.find("rope_scaling"); it != j.end()) f.rope_type = rope_type_of(*it);
  if (f.rope_type.empty()) {
    if (const auto it = j.find("rope_parameters"); it != j.end()) f.rope_type = rope_type_of(*it);
  }
  return f;
}

HfDecoderFacts read_hf_decoder_facts(const std::filesystem::path& dir) {
  const auto file = dir / "config.json";
  std::ifstream in(file, std::ios::binary);
  if (!in) fail_io("cannot read '" + file.string() + "'");
  std::ostringstream s;
  s << in.rdbuf();
  return parse_hf_decoder_facts(s.str(), file.string());
}

}  // namespace qforge
