#pragma once
// Little helpers for reading binary formats from untrusted bytes: little-endian loads and
// overflow-safe range checks. Every caller checks a range with `fits` before it loads.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>

namespace qforge::torch_detail {

template <typename T>
T load_le(const std::byte* p) {
  static_assert(sizeof(T) <= 8);
  uint64_t v = 0;
  for (size_t i = 0; i < sizeof(T); ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return static_cast<T>(v);
}

// True when [offset, offset + length) lies inside a buffer of `size` bytes.
inline bool fits(uint64_t offset, uint64_t length, uint64_t size) {
  return offset <= size && length <= size - offset;
}

// a + b, or false on overflow.
inline bool add_overflows(uint64_t a, uint64_t b, uint64_t& out) {
  return __builtin_add_overflow(a, b, &out);
}
inline bool mul_overflows(uint64_t a, uint64_t b, uint64_t& out) {
  return __builtin_mul_overflow(a, b, &out);
}

inline std::string_view as_chars(std::span<const std::byte> bytes) {
  return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
}

// A name read from a file, made safe for a one-line message: control bytes escaped, long
// names cut.
inline std::string printable(std::string_view s, size_t max_len = 200) {
  std::string out;
  for (size_t i = 0; i < s.size() && i < max_len; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7f) {
      static constexpr char kHex[] = "0123456789abcdef";
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  if (s.size() > max_len) out += "...";
  return out;
}

// 'name' for a message. (Built by appending: GCC 12 warns falsely on "'" + std::string.)
inline std::string quote(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 2);
  out += '\'';
  out += s;
  out += '\'';
  return out;
}

}  // namespace qforge::torch_detail
