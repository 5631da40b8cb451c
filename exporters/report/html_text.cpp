#include "exporters/report/html_text.h"

#include <charconv>
#include <cmath>
#include <system_error>

namespace qforge::report {

std::string escape_html(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string escape_script_json(std::string_view json) {
  std::string out;
  out.reserve(json.size());
  for (char c : json) {
    switch (c) {
      case '<': out += "\\u003c"; break;
      case '>': out += "\\u003e"; break;
      case '&': out += "\\u0026"; break;
      default: out += c;
    }
  }
  return out;
}

std::string css_token(std::string_view text) {
  std::string out(text);
  for (char& c : out) {
    const bool keep = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                      c == '-' || c == '_';
    if (!keep) c = '-';
  }
  return out;
}

namespace {

std::string non_finite(double v) {
  if (std::isnan(v)) return "nan";
  return v > 0 ? "inf" : "-inf";
}

// Fixed notation of a large double needs up to 309 digits before the point (and the
// precision's after it): the buffer grows until the text fits, never read past what was written.
std::string to_chars_text(double v, std::chars_format format, int precision) {
  std::string buf(64, '\0');
  for (;;) {
    char* const first = buf.data();
    char* const last = first + buf.size();
    const auto r = precision < 0 ? std::to_chars(first, last, v, format)
                                 : std::to_chars(first, last, v, format, precision);
    if (r.ec == std::errc{}) {
      buf.resize(static_cast<size_t>(r.ptr - first));
      return buf;
    }
    buf.assign(buf.size() * 2, '\0');
  }
}

}  // namespace

std::string number_exact(double v) {
  if (!std::isfinite(v)) return non_finite(v);
  return to_chars_text(v, std::chars_format::general, -1);
}

std::string number_fixed(double v, int decimals) {
  if (!std::isfinite(v)) return non_finite(v);
  std::string s = to_chars_text(v, std::chars_format::fixed, decimals);
  if (s.find_first_not_of("-0.") == std::string::npos && s.front() == '-') s.erase(0, 1);  // -0.00
  return s;
}

std::string number_general(double v, int digits) {
  if (!std::isfinite(v)) return non_finite(v);
  return to_chars_text(v, std::chars_format::general, digits);
}

std::string shorten_name(std::string_view name, size_t max_chars) {
  // Count characters, not bytes: UTF-8 continuation bytes are 10xxxxxx.
  size_t chars = 0;
  for (char c : name) chars += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  if (chars <= max_chars || max_chars < 2) return std::string(name);
  size_t keep = max_chars - 1;  // characters kept from the end, after the ellipsis
  size_t start = name.size();
  while (start > 0 && keep > 0) {
    --start;
    if ((static_cast<unsigned char>(name[start]) & 0xC0) != 0x80) --keep;
  }
  return "\xE2\x80\xA6" + std::string(name.substr(start));
}

}  // namespace qforge::report
