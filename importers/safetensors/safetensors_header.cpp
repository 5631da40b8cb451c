#include "importers/safetensors/safetensors_header.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>
#include <optional>
#include <string_view>

#include "importers/safetensors/strict_json.h"
#include "ir/error.h"

namespace qforge::safetensors_detail {

namespace {

using json = nlohmann::json;

struct StDType {
  std::string_view name;
  DType dtype;
  uint64_t size;
};

constexpr std::array<StDType, 10> kReadable = {{
    {"F64", DType::F64, 8},
    {"F32", DType::F32, 4},
    {"F16", DType::F16, 2},
    {"BF16", DType::BF16, 2},
    {"I64", DType::I64, 8},
    {"I32", DType::I32, 4},
    {"I16", DType::I16, 2},
    {"I8", DType::I8, 1},
    {"U8", DType::U8, 1},
    {"BOOL", DType::Bool, 1},
}};

const StDType* find_dtype(std::string_view name) {
  for (const auto& d : kReadable) {
    if (d.name == name) return &d;
  }
  return nullptr;
}

std::string readable_list() {
  std::string s;
  for (const auto& d : kReadable) s += (s.empty() ? "" : ", ") + std::string(d.name);
  return s;
}

std::optional<uint64_t> checked_mul(uint64_t a, uint64_t b) {
  if (a != 0 && b > std::numeric_limits<uint64_t>::max() / a) return std::nullopt;
  return a * b;
}

class HeaderParser {
 public:
  explicit HeaderParser(std::string file_name) : file_(std::move(file_name)) {}

  [[noreturn]] void bad(const std::string& what) const { fail_invalid("'" + file_ + "': " + what); }
  [[noreturn]] void bad_tensor(const std::string& name, const std::string& what) const {
    bad("tensor '" + name + "': " + what + "; the header is corrupt, re-save the file");
  }

  [[nodiscard]] TensorEntry parse_entry(const std::string& name, const json& value) const {
    if (!value.is_object())
      bad_tensor(name, "entry is " + std::string(value.type_name()) + ", expected an object");
    TensorEntry e;
    e.name = name;
    const auto dtype_it = value.find("dtype");
    if (dtype_it == value.end() || !dtype_it->is_string()) {
      bad_tensor(name, "missing \"dtype\" string");
    }
    const auto& dtype_name = dtype_it->get_ref<const std::string&>();
    const StDType* dtype = find_dtype(dtype_name);
    if (dtype == nullptr) {
      fail_unsupported("'" + file_ + "': unsupported dtype " + dtype_name + " in tensor '" + name +
                       "'; qforge reads " + readable_list() +
                       " (convert the tensor to one of these)");
    }
    e.dtype = dtype->dtype;

    const auto shape_it = value.find("shape");
    if (shape_it == value.end() || !shape_it->is_array()) {
      bad_tensor(name, "missing \"shape\" array");
    }
    uint64_t numel = 1;
    bool overflow = false;
    for (const auto& dim : *shape_it) {
      if (!dim.is_number_unsigned() ||
          dim.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        bad_tensor(name, "shape entry " + dim.dump() + " is not a non-negative integer");
      }
      const auto d = dim.get<uint64_t>();
      e.shape.push_back(static_cast<int64_t>(d));
      const auto next = checked_mul(numel, d);
      overflow = overflow || !next;
      if (next) numel = *next;
    }

    const auto off_it = value.find("data_offsets");
    if (off_it == value.end() || !off_it->is_array() || off_it->size() != 2 ||
        !(*off_it)[0].is_number_unsigned() || !(*off_it)[1].is_number_unsigned()) {
      bad_tensor(name, "missing \"data_offsets\" [begin, end] of non-negative integers");
    }
    e.begin = (*off_it)[0].get<uint64_t>();
    e.end = (*off_it)[1].get<uint64_t>();
    if (e.begin > e.end) {
      bad_tensor(name, "data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) +
                           "] begin after end");
    }
    // Left-to-right products, as the reference: [0, 2^40, 2^40] is empty, [2^40, 2^40, 0]
    // overflows.
    const auto nbytes = overflow ? std::nullopt : checked_mul(numel, dtype->size);
    if (!nbytes) {
      bad_tensor(name, "shape " + shape_to_string(e.shape) + " of " + dtype_name +
                           " overflows 64-bit byte counts");
    }
    if (*nbytes != e.end - e.begin) {
      bad_tensor(name, "shape " + shape_to_string(e.shape) + " of " + dtype_name + " needs " +
                           std::to_string(*nbytes) + " bytes but data_offsets [" +
                           std::to_string(e.begin) + ", " + std::to_string(e.end) + "] hold " +
                           std::to_string(e.end - e.begin));
    }
    return e;
  }

  void parse_metadata(const json& value, Header& header) const {
    if (!value.is_object()) {
      bad("__metadata__ is " + std::string(value.type_name()) +
          ", expected an object of strings; the header is corrupt");
    }
    for (const auto& [key, v] : value.items()) {
      if (!v.is_string()) {
        bad("__metadata__ key '" + key + "' is " + std::string(v.type_name()) +
            ", expected a string; the header is corrupt");
      }
      header.metadata.emplace_back(key, v.get<std::string>());
    }
  }

  // Offsets must tile [0, data_size) exactly: no hole, no overlap, nothing past the end and
  // nothing unclaimed after the last tensor.
  void check_tiling(const std::vector<TensorEntry>& tensors, uint64_t data_start,
                    uint64_t data_size) const {
    for (const auto& t : tensors) {
      if (t.end > data_size) {
        bad_tensor(t.name, "data_offsets [" + std::to_string(t.begin) + ", " +
                               std::to_string(t.end) + "] run past the " +
                               std::to_string(data_size) + "-byte data section (file offset " +
                               std::to_string(data_start + t.end) + " > file size " +
                               std::to_string(data_start + data_size) + "); truncated file?");
      }
    }
    uint64_t expected = 0;
    const TensorEntry* previous = nullptr;
    for (const auto& t : tensors) {
      if (t.begin > expected) {
        bad("hole of " + std::to_string(t.begin - expected) + " bytes before tensor '" + t.name +
            "' at file offset " + std::to_string(data_start + expected) +
            " (data_offsets must tile the data section); the file is corrupt");
      }
      if (t.begin < expected) {
        bad("tensor '" + t.name + "' data_offsets [" + std::to_string(t.begin) + ", " +
            std::to_string(t.end) + "] overlap tensor '" + previous->name + "' [" +
            std::to_string(previous->begin) + ", " + std::to_string(previous->end) +
            "] at file offset " + std::to_string(data_start + t.begin) + "; the file is corrupt");
      }
      expected = t.end;
      previous = &t;
    }
    if (expected != data_size) {
      bad(std::to_string(data_size - expected) + " bytes after the last tensor at file offset " +
          std::to_string(data_start + expected) +
          " are claimed by no tensor (data must end at end of file); the file is corrupt");
    }
  }

 private:
  std::string file_;
};

}  // namespace

Header parse_safetensors_header(std::span<const std::byte> file, const std::string& file_name) {
  const HeaderParser parser(file_name);
  if (file.size() < 8) {
    parser.bad("file is " + std::to_string(file.size()) +
               " bytes, too short for the 8-byte header length; not a safetensors file");
  }
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) {
    header_len = (header_len << 8) | static_cast<uint64_t>(file[static_cast<size_t>(i)]);
  }
  if (header_len > kMaxHeaderBytes) {
    parser.bad("header length " + std::to_string(header_len) + " exceeds the 100 MB limit; " +
               "not a safetensors file, or corrupt");
  }
  if (header_len > file.size() - 8) {
    parser.bad("header length " + std::to_string(header_len) + " runs past the end of the " +
               std::to_string(file.size()) + "-byte file; truncated or not a safetensors file");
  }
  const std::string_view text(reinterpret_cast<const char*>(file.data()) + 8, header_len);
  if (text.empty() || text.front() != '{') {
    parser.bad("header does not start with '{' at file offset 8; not a safetensors file");
  }
  const json root = parse_strict_json(text, "'" + file_name + "' header", "tensor name");
  if (!root.is_object()) {
    parser.bad("header is a JSON " + std::string(root.type_name()) + ", expected an object");
  }

  Header header;
  header.data_start = 8 + header_len;
  for (const auto& [key, value] : root.items()) {
    if (key == "__metadata__") {
      parser.parse_metadata(value, header);
    } else {
      header.tensors.push_back(parser.parse_entry(key, value));
    }
  }
  std::sort(header.tensors.begin(), header.tensors.end(), [](const auto& a, const auto& b) {
    return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
  });
  parser.check_tiling(header.tensors, header.data_start, file.size() - header.data_start);
  return header;
}

}  // namespace qforge::safetensors_detail
