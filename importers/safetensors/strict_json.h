#pragma once
// JSON parsing for headers and indexes read from untrusted files: valid UTF-8 only and no
// duplicate object keys (nlohmann silently keeps the last of two equal keys, which would let
// one file mean two different things to two readers).
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace qforge::safetensors_detail {

// Offset of the first byte that is not part of well-formed UTF-8 (overlong forms, surrogates
// and code points above U+10FFFF are ill-formed, as in Rust's str::from_utf8).
std::optional<size_t> find_invalid_utf8(std::string_view text);

// Parses `text`; throws Error(InvalidInput) starting with `where` on invalid UTF-8, malformed
// JSON (with the byte offset) or a duplicate key. `top_level_key_kind` names what the keys of
// the root object are ("tensor name") for the duplicate message.
nlohmann::json parse_strict_json(std::string_view text, const std::string& where,
                                 std::string_view top_level_key_kind);

}  // namespace qforge::safetensors_detail
