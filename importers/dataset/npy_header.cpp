#include "importers/dataset/npy_header.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <string>

#include "ir/error.h"

namespace qforge {

namespace {

constexpr uint64_t kMaxHeader = uint64_t{1} << 20;  // numpy writes a few hundred bytes at most
constexpr size_t kMaxRank = 64;
constexpr unsigned char kMagic[] = {0x93, 'N', 'U', 'M', 'P', 'Y'};

std::string in_quotes(std::string_view s) {
  std::string out = "'";
  out += s;
  out += "'";
  return out;
}

// The header is a Python dict literal holding exactly 'descr', 'fortran_order' and 'shape'.
class DictParser {
 public:
  DictParser(std::string_view text, std::string_view source) : s_(text), source_(source) {}

  void parse(std::string& descr, bool& fortran, Shape& shape) {
    bool have_descr = false, have_fortran = false, have_shape = false;
    skip_spaces();
    expect('{');
    while (true) {
      skip_spaces();
      if (peek() == '}') break;
      const std::string key = string_literal();
      skip_spaces();
      expect(':');
      skip_spaces();
      if (key == "descr" && !have_descr) {
        descr = string_literal();
        have_descr = true;
      } else if (key == "fortran_order" && !have_fortran) {
        fortran = boolean();
        have_fortran = true;
      } else if (key == "shape" && !have_shape) {
        shape = tuple();
        have_shape = true;
      } else {
        bad("has an unexpected or repeated key '" + key + "'");
      }
      skip_spaces();
      if (peek() == ',') {
        ++pos_;
      } else if (peek() != '}') {
        bad("expects ',' or '}'");
      }
    }
    ++pos_;
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\n')) ++pos_;
    if (pos_ != s_.size()) bad("has bytes after the dict");
    if (!have_descr || !have_fortran || !have_shape) {
      bad("lacks one of 'descr', 'fortran_order' and 'shape'");
    }
  }

 private:
  [[noreturn]] void bad(const std::string& what) const {
    fail_invalid(std::string(source_) + " is not a valid .npy array: its header " + what +
                 " at header byte " + std::to_string(pos_) + "; re-save it with numpy.save");
  }
  [[nodiscard]] char peek() const { return pos_ < s_.size() ? s_[pos_] : '\0'; }
  void skip_spaces() {
    while (peek() == ' ') ++pos_;
  }
  void expect(char c) {
    if (peek() != c) bad(std::string("expects '") + c + "'");
    ++pos_;
  }
  std::string string_literal() {
    const char q = peek();
    if (q != '\'' && q != '"') bad("expects a quoted string");
    const size_t end = s_.find(q, pos_ + 1);
    if (end == std::string_view::npos) bad("has an unterminated string");
    std::string out(s_.substr(pos_ + 1, end - pos_ - 1));
    pos_ = end + 1;
    return out;
  }
  bool boolean() {
    if (s_.substr(pos_, 4) == "True") {
      pos_ += 4;
      return true;
    }
    if (s_.substr(pos_, 5) == "False") {
      pos_ += 5;
      return false;
    }
    bad("expects True or False");
  }
  Shape tuple() {
    expect('(');
    Shape out;
    while (true) {
      skip_spaces();
      if (peek() == ')') break;
      if (peek() < '0' || peek() > '9') bad("expects a dimension");
      int64_t v = 0;
      while (peek() >= '0' && peek() <= '9') {
        if (v > (std::numeric_limits<int64_t>::max() - 9) / 10) bad("has a dimension too large");
        v = v * 10 + (peek() - '0');
        ++pos_;
      }
      if (out.size() == kMaxRank) bad("has more than 64 dimensions");
      out.push_back(v);
      skip_spaces();
      if (peek() == ',') {
        ++pos_;
      } else if (peek() != ')') {
        bad("expects ',' or ')' in the shape");
      }
    }
    ++pos_;
    return out;
  }

  std::string_view s_;
  std::string_view source_;
  size_t pos_ = 0;
};

DType npy_dtype(const std::string& descr, std::string_view source) {
  const std::string src(source);
  if (descr.find('O') != std::string::npos) {
    fail_unsupported(src + " holds Python objects (dtype " + in_quotes(descr) +
                     "); save numeric arrays only");
  }
  if (descr.size() == 3) {
    const char order = descr[0];
    const std::string_view code = std::string_view(descr).substr(1);
    const bool one_byte = code == "i1" || code == "u1" || code == "b1";
    if (order == '>' && !one_byte) {
      fail_unsupported(src + " holds big-endian data (" + in_quotes(descr) +
                       "); re-save it with .astype('<" + std::string(code) + "')");
    }
    if (order == '<' || order == '|' || order == '=' || order == '>') {
      if (code == "f4" && order == '<') return DType::F32;
      if (code == "f8" && order == '<') return DType::F64;
      if (code == "f2" && order == '<') return DType::F16;
      if (code == "i8" && order == '<') return DType::I64;
      if (code == "i4" && order == '<') return DType::I32;
      if (code == "i2" && order == '<') return DType::I16;
      if (code == "i1") return DType::I8;
      if (code == "u1") return DType::U8;
      if (code == "b1") return DType::Bool;
    }
  }
  fail_unsupported(src + " has dtype " + in_quotes(descr) +
                   ", which qforge does not read; use float32, float16, float64, int64, int32, "
                   "int16, int8, uint8 or bool");
}

uint64_t read_le(std::span<const std::byte> b, size_t off, size_t n) {
  uint64_t v = 0;
  for (size_t i = 0; i < n; ++i) v |= static_cast<uint64_t>(b[off + i]) << (8 * i);
  return v;
}

}  // namespace

uint64_t npy_header_size(std::span<const std::byte> b, std::string_view source) {
  const std::string src(source);
  if (b.size() < 10 || std::memcmp(b.data(), kMagic, sizeof kMagic) != 0) {
    fail_invalid(src + " is not a .npy file (no \\x93NUMPY magic)");
  }
  const auto major = static_cast<uint8_t>(b[6]);
  if (major < 1 || major > 3) {
    fail_unsupported(src + " is .npy format " + std::to_string(major) +
                     ".x; qforge reads 1.0 to 3.0");
  }
  const size_t len_bytes = major == 1 ? 2 : 4;
  if (b.size() < 8 + len_bytes) fail_invalid(src + " is truncated in its .npy preamble");
  const uint64_t header_len = read_le(b, 8, len_bytes);
  if (header_len > kMaxHeader) {
    fail_invalid(src + " declares a .npy header of " + std::to_string(header_len) +
                 " bytes, beyond qforge's 1 MiB cap");
  }
  return 8 + len_bytes + header_len;
}

NpyHeader parse_npy_header(std::span<const std::byte> b, std::string_view source) {
  const std::string src(source);
  NpyHeader h;
  h.data_offset = npy_header_size(b.first(std::min(b.size(), kNpyPreamble)), source);
  if (b.size() < h.data_offset) {
    fail_invalid(src + " is truncated inside its .npy header (" + std::to_string(b.size()) +
                 " of " + std::to_string(h.data_offset) + " bytes)");
  }
  const size_t text_start = static_cast<uint8_t>(b[6]) == 1 ? 10 : 12;
  const std::string_view text(reinterpret_cast<const char*>(b.data()) + text_start,
                              h.data_offset - text_start);
  std::string descr;
  bool fortran = false;
  DictParser(text, source).parse(descr, fortran, h.shape);
  h.dtype = npy_dtype(descr, source);
  h.descr = descr;
  if (fortran && h.shape.size() > 1) {
    fail_unsupported(src + " is in Fortran order; re-save it with np.ascontiguousarray");
  }
  const auto bytes = dtype_storage_bytes(h.dtype, shape_numel(h.shape));
  if (!bytes) fail_invalid(src + " has a shape " + shape_to_string(h.shape) + " too large");
  h.data_bytes = *bytes;
  return h;
}

}  // namespace qforge
