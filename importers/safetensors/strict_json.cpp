#include "importers/safetensors/strict_json.h"

#include <set>
#include <vector>

#include "ir/error.h"

namespace qforge::safetensors_detail {

std::optional<size_t> find_invalid_utf8(std::string_view text) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    const unsigned char c = s[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len = 0;
    unsigned char lo = 0x80;  // allowed range of the second byte
    unsigned char hi = 0xbf;
    if (c >= 0xc2 && c <= 0xdf) {
      len = 2;
    } else if (c >= 0xe0 && c <= 0xef) {
      len = 3;
      if (c == 0xe0) lo = 0xa0;  // overlong
      if (c == 0xed) hi = 0x9f;  // surrogates
    } else if (c >= 0xf0 && c <= 0xf4) {
      len = 4;
      if (c == 0xf0) lo = 0x90;  // overlong
      if (c == 0xf4) hi = 0x8f;  // above U+10FFFF
    } else {
      return i;
    }
    if (i + len > n) return i;
    if (s[i + 1] < lo || s[i + 1] > hi) return i;
    for (size_t k = 2; k < len; ++k) {
      if (s[i + k] < 0x80 || s[i + k] > 0xbf) return i;
    }
    i += len;
  }
  return std::nullopt;
}

namespace {
// Strips nlohmann's "[json.exception.parse_error.101] " prefix from a message.
std::string plain_message(const char* what) {
  std::string msg = what;
  const auto pos = msg.find("] ");
  if (msg.rfind("[json.exception.", 0) == 0 && pos != std::string::npos) msg.erase(0, pos + 2);
  return msg;
}
}  // namespace

nlohmann::json parse_strict_json(std::string_view text, const std::string& where,
                                 std::string_view top_level_key_kind) {
  if (const auto bad = find_invalid_utf8(text)) {
    fail_invalid(where + " is not valid UTF-8 at byte " + std::to_string(*bad) +
                 "; the file is corrupt");
  }
  using json = nlohmann::json;
  std::vector<std::set<std::string>> open_objects;  // keys seen, per object being parsed
  std::string top_key;                              // the root object's current key
  const json::parser_callback_t check_keys = [&](int /*depth*/, json::parse_event_t event,
                                                 json& parsed) {
    if (event == json::parse_event_t::object_start) {
      open_objects.emplace_back();
    } else if (event == json::parse_event_t::object_end) {
      open_objects.pop_back();
    } else if (event == json::parse_event_t::key) {
      auto key = parsed.get<std::string>();
      if (open_objects.size() == 1) top_key = key;
      if (!open_objects.back().insert(key).second) {
        if (open_objects.size() == 1) {
          fail_invalid(where + ": duplicate " + std::string(top_level_key_kind) + " '" + key +
                       "'; each name may appear once");
        }
        fail_invalid(where + ": duplicate key '" + key + "' inside '" + top_key +
                     "'; each key may appear once");
      }
    }
    return true;
  };
  try {
    return json::parse(text, check_keys);
  } catch (const json::parse_error& e) {
    fail_invalid(where + " is not valid JSON (error at byte " +
                 std::to_string(e.byte == 0 ? 0 : e.byte - 1) + "): " + plain_message(e.what()));
  }
}

}  // namespace qforge::safetensors_detail
