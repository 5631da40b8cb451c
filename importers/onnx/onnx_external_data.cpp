// External data of ONNX tensors: `location` (relative to the model's folder), `offset` and
// `length` entries. The data file is memory-mapped once and tensors are windows of it.
#include <algorithm>
#include <charconv>
#include <system_error>

#include "importers/onnx/onnx_tensor.h"
#include "ir/error.h"

namespace qforge {

namespace {

uint64_t parse_u64(const std::string& text, std::string_view key, const std::string& where) {
  uint64_t v = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, v);
  if (text.empty() || ec != std::errc() || ptr != end) {
    fail_invalid("external data " + std::string(key) + " '" + text + "' of " + where +
                 " is not a non-negative integer; the file is corrupt");
  }
  return v;
}

// True when `inner` is `outer` or lies below it (both canonical).
bool is_within(const std::filesystem::path& inner, const std::filesystem::path& outer) {
  auto i = inner.begin();
  for (auto o = outer.begin(); o != outer.end(); ++o, ++i) {
    if (o->empty()) continue;  // trailing separator
    if (i == inner.end() || *i != *o) return false;
  }
  return true;
}

}  // namespace

std::shared_ptr<const Storage> OnnxTensorReader::map_data_file(const std::string& location,
                                                              const std::string& where) {
  const std::filesystem::path rel(location);
  if (location.empty()) {
    fail_invalid(where + " has external data with an empty location; re-export the model");
  }
  if (rel.is_absolute() || rel.has_root_name() || rel.has_root_directory()) {
    fail_invalid("external data location '" + location + "' of " + where +
                 " is an absolute path; ONNX requires a path relative to the model's folder");
  }
  if (std::any_of(rel.begin(), rel.end(), [](const auto& part) { return part == ".."; })) {
    fail_invalid("external data location '" + location + "' of " + where +
                 " leaves the model's folder ('..'); keep data files beside the model");
  }
  std::error_code ec;
  const std::filesystem::path full = std::filesystem::weakly_canonical(model_dir_ / rel, ec);
  if (ec) fail_io("cannot resolve external data file '" + location + "' of " + where + ": " + ec.message());
  if (!is_within(full, canonical_dir_)) {
    fail_invalid("external data location '" + location + "' of " + where + " resolves to '" +
                 full.string() + "', outside the model's folder '" + canonical_dir_.string() +
                 "' (through a symbolic link); copy the data file into the model's folder");
  }
  if (const auto it = files_.find(full); it != files_.end()) return it->second;
  if (!std::filesystem::exists(full, ec)) {
    fail_io("external data file '" + location + "' of " + where + " is missing (looked for '" +
            full.string() + "'); copy it next to the model");
  }
  std::shared_ptr<const MappedFile> file;
  try {
    file = MappedFile::open(full);
  } catch (const Error& e) {
    fail(e.category(), std::string(e.what()) + " (external data of " + where + ")");
  }
  auto storage = std::make_shared<const MappedStorage>(std::move(file));
  files_.emplace(full, storage);
  return storage;
}

Tensor OnnxTensorReader::read_external(const onnx::TensorProto& proto, DType dtype, Shape shape,
                                       size_t nbytes, const std::string& where) {
  const std::string* location = nullptr;
  const std::string* offset_text = nullptr;
  const std::string* length_text = nullptr;
  const std::string* repeated_key = nullptr;
  for (const auto& entry : proto.external_data()) {
    const std::string* value = &entry.value();
    const std::string& key = entry.key();
    const std::string** slot = key == "location" ? &location
                               : key == "offset" ? &offset_text
                               : key == "length" ? &length_text
                                                 : nullptr;
    if (slot == nullptr) continue;  // "checksum" and future keys carry nothing we need
    if (*slot != nullptr) repeated_key = &key;
    *slot = value;
  }
  if (repeated_key != nullptr) {
    fail_invalid(where + " lists external data key '" + *repeated_key +
                 "' twice; the file is corrupt");
  }
  if (location == nullptr) {
    fail_invalid(where + " has external data without a location; re-export the model");
  }
  const uint64_t offset = offset_text ? parse_u64(*offset_text, "offset", where) : 0;
  const uint64_t length = length_text ? parse_u64(*length_text, "length", where) : nbytes;
  if (length != nbytes) {
    fail_invalid("external data length " + std::to_string(length) + " of " + where +
                 " does not match its shape " + shape_to_string(shape) + " of " +
                 std::string(dtype_name(dtype)) + " (" + std::to_string(nbytes) +
                 " bytes); the file is corrupt");
  }
  auto storage = map_data_file(*location, where);
  const uint64_t file_size = storage->bytes().size();
  if (offset > file_size || length > file_size - offset) {
    fail_invalid("external data of " + where + " (offset " + std::to_string(offset) +
                 ", length " + std::to_string(length) + ") runs past the end of '" + *location +
                 "' (" + std::to_string(file_size) +
                 " bytes); the data file is truncated or belongs to another model");
  }
  return {dtype, std::move(shape), std::move(storage), static_cast<size_t>(offset)};
}

}  // namespace qforge
