#include "importers/gguf/gguf_reader.h"

#include <cstring>
#include <fstream>
#include <map>
#include <set>

#include "ir/error.h"

namespace qforge::gguf {

namespace {

// A cursor over the file's bytes; every read is checked against what is left.
class Cursor {
 public:
  Cursor(std::span<const std::byte> bytes, const std::string& file) : b_(bytes), file_(file) {}

  uint64_t pos() const { return pos_; }
  uint64_t left() const { return b_.size() - pos_; }

  [[noreturn]] void fail(const std::string& what) const {
    fail_invalid("GGUF '" + file_ + "' at byte " + std::to_string(pos_) + ": " + what +
                 "; the file is truncated or corrupt (re-export it)");
  }

  template <typename T>
  T read(const char* what) {
    if (left() < sizeof(T)) fail(std::string("file ends inside ") + what);
    T v;
    std::memcpy(&v, b_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  std::string read_string(const char* what) {
    const uint64_t n = read<uint64_t>(what);
    if (n > kMaxStringBytes) {
      fail(std::string(what) + " length " + std::to_string(n) + " exceeds the cap of " +
           std::to_string(kMaxStringBytes) + " bytes");
    }
    if (n > left()) {
      fail(std::string(what) + " length " + std::to_string(n) + " runs past the end of the file");
    }
    std::string s(reinterpret_cast<const char*>(b_.data() + pos_), n);
    pos_ += n;
    return s;
  }

 private:
  std::span<const std::byte> b_;
  const std::string& file_;
  uint64_t pos_ = 0;
};

uint64_t scalar_size(ValueType t) {
  switch (t) {
    case ValueType::U8: case ValueType::I8: case ValueType::Bool: return 1;
    case ValueType::U16: case ValueType::I16: return 2;
    case ValueType::U32: case ValueType::I32: case ValueType::F32: return 4;
    case ValueType::U64: case ValueType::I64: case ValueType::F64: return 8;
    case ValueType::String: return 8;  // at least its length field
    case ValueType::Array: return 0;
  }
  return 0;
}

bool known_value_type(uint32_t t) { return t <= static_cast<uint32_t>(ValueType::F64); }

nlohmann::json read_scalar(Cursor& c, ValueType t) {
  switch (t) {
    case ValueType::U8: return c.read<uint8_t>("a u8 value");
    case ValueType::I8: return c.read<int8_t>("an i8 value");
    case ValueType::U16: return c.read<uint16_t>("a u16 value");
    case ValueType::I16: return c.read<int16_t>("an i16 value");
    case ValueType::U32: return c.read<uint32_t>("a u32 value");
    case ValueType::I32: return c.read<int32_t>("an i32 value");
    case ValueType::F32: return c.read<float>("an f32 value");
    case ValueType::U64: return c.read<uint64_t>("a u64 value");
    case ValueType::I64: return c.read<int64_t>("an i64 value");
    case ValueType::F64: return c.read<double>("an f64 value");
    case ValueType::Bool: {
      const auto v = c.read<uint8_t>("a bool value");
      if (v > 1) c.fail("bool value " + std::to_string(v) + " is neither 0 nor 1");
      return v == 1;
    }
    case ValueType::String: return c.read_string("a string value");
    case ValueType::Array: break;
  }
  c.fail("nested array");
}

KeyValue read_kv(Cursor& c) {
  KeyValue kv;
  kv.key = c.read_string("a metadata key");
  if (kv.key.empty()) c.fail("empty metadata key");
  const auto type = c.read<uint32_t>("a value type");
  if (!known_value_type(type)) {
    c.fail("key '" + kv.key + "' has unknown value type " + std::to_string(type));
  }
  kv.type = static_cast<ValueType>(type);
  if (kv.type != ValueType::Array) {
    kv.value = read_scalar(c, kv.type);
    return kv;
  }
  const auto elem = c.read<uint32_t>("an array element type");
  if (!known_value_type(elem) || elem == static_cast<uint32_t>(ValueType::Array)) {
    c.fail("key '" + kv.key + "' is an array of unknown or nested type " + std::to_string(elem));
  }
  kv.element_type = static_cast<ValueType>(elem);
  const auto count = c.read<uint64_t>("an array length");
  // Each element takes at least scalar_size bytes: checked before anything is allocated.
  if (count > c.left() / scalar_size(kv.element_type)) {
    c.fail("key '" + kv.key + "' has an array of " + std::to_string(count) +
           " elements, more than the file holds");
  }
  kv.value = nlohmann::json::array();
  for (uint64_t i = 0; i < count; ++i) kv.value.push_back(read_scalar(c, kv.element_type));
  return kv;
}

uint64_t align_up(uint64_t n, uint64_t a) { return (n + a - 1) / a * a; }

TensorEntry read_tensor_info(Cursor& c) {
  TensorEntry t;
  t.name = c.read_string("a tensor name");
  if (t.name.empty()) c.fail("empty tensor name");
  if (t.name.size() >= 64) {  // GGML_MAX_NAME
    c.fail("tensor name '" + t.name.substr(0, 64) + "...' is longer than 63 bytes");
  }
  const auto n_dims = c.read<uint32_t>("a tensor's dimension count");
  if (n_dims == 0 || n_dims > 4) {
    c.fail("tensor '" + t.name + "' has " + std::to_string(n_dims) + " dimensions (1 to 4)");
  }
  uint64_t numel = 1;
  for (uint32_t i = 0; i < n_dims; ++i) {
    const auto n = c.read<uint64_t>("a tensor dimension");
    if (n == 0 || n > static_cast<uint64_t>(INT64_MAX) / numel) {
      c.fail("tensor '" + t.name + "' has dimension " + std::to_string(n) +
             " (zero, or the element count overflows)");
    }
    numel *= n;
    t.ne.push_back(n);
  }
  const auto type = c.read<uint32_t>("a tensor type");
  const auto info = tensor_type_info(type);
  if (!info) {
    fail_unsupported("GGUF tensor '" + t.name + "' has ggml type " + std::to_string(type) +
                     ", which qforge does not read (it reads F32, F16, BF16, Q8_0, Q4_0, Q4_1)");
  }
  t.type = info->type;
  if (t.ne[0] % info->block_size != 0) {
    c.fail("tensor '" + t.name + "' row of " + std::to_string(t.ne[0]) +
           " elements is not a whole number of " + std::string(info->name) + " blocks");
  }
  t.nbytes = numel / info->block_size * info->type_size;
  t.offset = c.read<uint64_t>("a tensor offset");
  return t;
}

}  // namespace

const KeyValue* GgufFile::find(const std::string& key) const {
  for (const auto& kv : metadata) {
    if (kv.key == key) return &kv;
  }
  return nullptr;
}

const TensorEntry* GgufFile::find_tensor(const std::string& name) const {
  for (const auto& t : tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

GgufFile parse_gguf(std::span<const std::byte> bytes, const std::string& file) {
  Cursor c(bytes, file);
  GgufFile g;
  if (c.read<uint32_t>("the magic") != kMagic) c.fail("not a GGUF file (no 'GGUF' magic)");
  g.version = c.read<uint32_t>("the version");
  if (g.version < 2 || g.version > 3) {
    fail_unsupported("GGUF '" + file + "' is version " + std::to_string(g.version) +
                     "; qforge reads versions 2 and 3");
  }
  const auto n_tensors = c.read<uint64_t>("the tensor count");
  const auto n_kv = c.read<uint64_t>("the metadata count");
  if (n_tensors > kMaxTensors) {
    c.fail("tensor count " + std::to_string(n_tensors) + " is too large");
  }
  if (n_kv > kMaxKeyValues) c.fail("metadata count " + std::to_string(n_kv) + " is too large");
  std::set<std::string> keys;
  for (uint64_t i = 0; i < n_kv; ++i) {
    const uint64_t at = c.pos();
    KeyValue kv = read_kv(c);
    if (!keys.insert(kv.key).second) {
      fail_invalid("GGUF '" + file + "' at byte " + std::to_string(at) + ": metadata key '" +
                   kv.key + "' appears twice");
    }
    g.metadata.push_back(std::move(kv));
  }
  if (const KeyValue* a = g.find("general.alignment")) {
    if (a->type != ValueType::U32) c.fail("general.alignment is not a u32");
    const auto v = a->value.get<uint32_t>();
    if (v == 0 || (v & (v - 1)) != 0) {
      c.fail("general.alignment " + std::to_string(v) + " is not a power of two");
    }
    g.alignment = v;
  }
  std::set<std::string> names;
  for (uint64_t i = 0; i < n_tensors; ++i) {
    const uint64_t at = c.pos();
    TensorEntry t = read_tensor_info(c);
    if (!names.insert(t.name).second) {
      fail_invalid("GGUF '" + file + "' at byte " + std::to_string(at) + ": tensor '" + t.name +
                   "' appears twice");
    }
    g.tensors.push_back(std::move(t));
  }
  g.data_offset = align_up(c.pos(), g.alignment);
  const uint64_t data_size = bytes.size() >= g.data_offset ? bytes.size() - g.data_offset : 0;
  if (!g.tensors.empty() && bytes.size() < g.data_offset) {
    c.fail("file ends before its data section (at byte " + std::to_string(g.data_offset) + ")");
  }
  std::map<uint64_t, const TensorEntry*> by_offset;
  for (const auto& t : g.tensors) {
    if (t.offset % g.alignment != 0) {
      fail_invalid("GGUF '" + file + "': tensor '" + t.name + "' offset " +
                   std::to_string(t.offset) + " is not a multiple of the alignment " +
                   std::to_string(g.alignment));
    }
    if (t.offset > data_size || t.nbytes > data_size - t.offset) {
      fail_invalid("GGUF '" + file + "': tensor '" + t.name + "' data (" +
                   std::to_string(t.nbytes) + " bytes at offset " + std::to_string(t.offset) +
                   ") lies outside the file's " + std::to_string(data_size) +
                   "-byte data section; the file is truncated or corrupt");
    }
    if (!by_offset.emplace(t.offset, &t).second && t.nbytes > 0) {
      fail_invalid("GGUF '" + file + "': tensors '" + by_offset[t.offset]->name + "' and '" +
                   t.name + "' share offset " + std::to_string(t.offset));
    }
  }
  uint64_t end = 0;
  const TensorEntry* prev = nullptr;
  for (const auto& [offset, t] : by_offset) {
    if (prev != nullptr && offset < end) {
      fail_invalid("GGUF '" + file + "': tensor '" + t->name + "' overlaps '" + prev->name + "'");
    }
    end = offset + t->nbytes;
    prev = t;
  }
  return g;
}

std::span<const std::byte> GgufModel::tensor_data(const TensorEntry& t) const {
  return map->bytes().subspan(file.data_offset + t.offset, t.nbytes);
}

GgufModel read_gguf(const std::filesystem::path& path) {
  GgufModel m;
  m.map = MappedFile::open(path);
  m.file = parse_gguf(m.map->bytes(), path.string());
  return m;
}

bool looks_like_gguf(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  if (!in.read(magic, 4)) return false;
  return std::memcmp(magic, "GGUF", 4) == 0;
}

}  // namespace qforge::gguf
