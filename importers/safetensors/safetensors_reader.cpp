#include "importers/safetensors/safetensors_reader.h"

#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "importers/safetensors/safetensors_header.h"
#include "importers/safetensors/safetensors_packed.h"
#include "ir/error.h"
#include "ir/mapped_file.h"

namespace qforge {

namespace {

using safetensors_detail::Header;
using safetensors_detail::TensorEntry;

struct Packed {
  DType dtype;
  Shape shape;
};

Shape parse_logical_shape(const std::string& text, const std::string& where) {
  const auto j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_array()) fail_invalid(where + " = '" + text + "' is not a JSON array of dims");
  Shape shape;
  for (const auto& d : j) {
    if (!d.is_number_unsigned() || d.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
      fail_invalid(where + " = '" + text + "' holds a dim that is not a non-negative integer");
    }
    shape.push_back(d.get<int64_t>());
  }
  return shape;
}

// Splits the qforge.dtype.* / qforge.shape.* entries (packed 4-bit tensors) from the
// metadata that is kept as is.
std::map<std::string, Packed> take_packed_entries(Header& header, const std::string& file) {
  using namespace safetensors_detail;
  std::map<std::string, Packed> packed;
  std::map<std::string, std::string> shapes;
  std::vector<std::pair<std::string, std::string>> kept;
  for (auto& [key, value] : header.metadata) {
    const std::string where = "'" + file + "': __metadata__ '" + key + "'";
    if (key.starts_with(kPackedDTypePrefix)) {
      const auto dtype = dtype_from_name(value);
      if (!dtype || dtype_bits(*dtype) != 4) {
        fail_invalid(where + " = '" + value + "': expected i4 or u4; the metadata is corrupt");
      }
      packed[key.substr(kPackedDTypePrefix.size())].dtype = *dtype;
    } else if (key.starts_with(kPackedShapePrefix)) {
      shapes[key.substr(kPackedShapePrefix.size())] = value;
    } else {
      kept.emplace_back(std::move(key), std::move(value));
    }
  }
  header.metadata = std::move(kept);
  for (auto& [name, p] : packed) {
    const auto it = shapes.find(name);
    if (it == shapes.end()) {
      fail_invalid("'" + file + "': __metadata__ has " + std::string(kPackedDTypePrefix) + name +
                   " but no " + std::string(kPackedShapePrefix) + name +
                   "; the metadata is corrupt");
    }
    p.shape = parse_logical_shape(it->second, "'" + file + "': __metadata__ '" +
                                                  std::string(kPackedShapePrefix) + name + "'");
    shapes.erase(it);
  }
  if (!shapes.empty()) {
    const auto& name = shapes.begin()->first;
    fail_invalid("'" + file + "': __metadata__ has " + std::string(kPackedShapePrefix) + name +
                 " but no " + std::string(kPackedDTypePrefix) + name + "; the metadata is corrupt");
  }
  return packed;
}

Tensor unpack_view(const TensorEntry& e, const Packed& p, std::shared_ptr<const Storage> storage,
                   size_t offset, const std::string& file) {
  const auto need = dtype_storage_bytes(p.dtype, shape_numel(p.shape));
  if (e.dtype != DType::U8 || e.shape.size() != 1 || !need || *need != e.end - e.begin) {
    fail_invalid("'" + file + "': tensor '" + e.name + "' is marked " +
                 std::string(dtype_name(p.dtype)) + " of shape " + shape_to_string(p.shape) +
                 " but is stored as " + std::string(dtype_name(e.dtype)) + " " +
                 shape_to_string(e.shape) + "; expected U8 [" + std::to_string(need.value_or(0)) +
                 "] of packed bytes");
  }
  return {p.dtype, p.shape, std::move(storage), offset};
}

}  // namespace

Graph import_safetensors_storage(const std::shared_ptr<const Storage>& storage,
                                 std::string_view name) {
  const std::string file(name);
  Header header = safetensors_detail::parse_safetensors_header(storage->bytes(), file);
  auto packed = take_packed_entries(header, file);

  Graph graph;
  graph.set_metadata("source_format", "safetensors");
  graph.set_metadata("source_path", file);
  for (auto& [key, value] : header.metadata) {
    graph.set_metadata("safetensors." + key, std::move(value));
  }
  for (const auto& e : header.tensors) {
    const size_t offset = header.data_start + e.begin;
    const auto p = packed.find(e.name);
    if (p != packed.end()) {
      graph.set_initializer(e.name, unpack_view(e, p->second, storage, offset, file));
      packed.erase(p);
    } else {
      graph.set_initializer(e.name, Tensor(e.dtype, e.shape, storage, offset));
    }
  }
  if (!packed.empty()) {
    fail_invalid("'" + file + "': __metadata__ describes packed tensor '" + packed.begin()->first +
                 "' that the file does not hold; the metadata is corrupt");
  }
  return graph;
}

Graph import_safetensors(const std::filesystem::path& path) {
  auto storage = std::make_shared<MappedStorage>(MappedFile::open(path));
  return import_safetensors_storage(storage, path.string());
}

Graph import_safetensors_bytes(std::span<const std::byte> bytes, std::string_view name) {
  auto storage = std::make_shared<OwnedStorage>(bytes.size());
  if (!bytes.empty()) std::copy(bytes.begin(), bytes.end(), storage->mutable_bytes().begin());
  return import_safetensors_storage(storage, name);
}

Graph import_safetensors_any(const std::filesystem::path& path) {
  if (path.filename().string().ends_with(".safetensors.index.json")) {
    return import_safetensors_index(path);
  }
  return import_safetensors(path);
}

}  // namespace qforge
