// Sharded checkpoints: `model.safetensors.index.json` maps every tensor to its shard file.
#include <map>
#include <set>
#include <string>
#include <system_error>

#include <spdlog/spdlog.h>

#include "importers/safetensors/safetensors_reader.h"
#include "importers/safetensors/strict_json.h"
#include "ir/error.h"
#include "ir/mapped_file.h"

namespace qforge {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr size_t kMaxIndexBytes = 100'000'000;

// A shard named by the index must be a file inside the index's folder, also once every link
// on the way is followed.
fs::path resolve_shard(const fs::path& folder, const std::string& shard, const std::string& tensor,
                       const std::string& where) {
  const std::string what = where + ": shard '" + shard + "' of tensor '" + tensor + "'";
  const fs::path rel(shard);
  if (shard.empty() || rel.has_root_path()) {
    fail_invalid(what + " must be a file name relative to the index's folder");
  }
  for (const auto& part : rel) {
    if (part == "..") fail_invalid(what + " may not use '..'; shards must sit beside the index");
  }
  std::error_code ec;
  const fs::path canonical_folder = fs::canonical(folder, ec);
  if (ec) fail_io(where + ": cannot resolve its folder '" + folder.string() + "': " + ec.message());
  fs::path target = fs::canonical(folder / rel, ec);
  if (ec) fail_io(what + " cannot be opened: " + ec.message());
  const fs::path inside = target.lexically_relative(canonical_folder);
  if (inside.empty() || *inside.begin() == "..") {
    fail_invalid(what + " links to '" + target.string() +
                 "', outside the index's folder; copy the shard into the folder instead");
  }
  return target;
}

json read_index_json(const fs::path& index_path, const std::string& where) {
  const auto file = MappedFile::open(index_path);
  if (file->size() > kMaxIndexBytes) {
    fail_invalid(where + " is " + std::to_string(file->size()) +
                 " bytes, over the 100 MB limit for an index; not a safetensors index");
  }
  const std::string_view text(reinterpret_cast<const char*>(file->bytes().data()), file->size());
  json root = safetensors_detail::parse_strict_json(text, where, "key");
  if (!root.is_object())
    fail_invalid(where + " is a JSON " + root.type_name() + ", expected an object");
  const auto wm = root.find("weight_map");
  if (wm == root.end() || !wm->is_object()) {
    fail_invalid(where + " has no \"weight_map\" object; not a safetensors index");
  }
  for (const auto& [tensor, shard] : wm->items()) {
    if (!shard.is_string()) {
      fail_invalid(where + ": weight_map entry '" + tensor + "' is " + shard.type_name() +
                   ", expected a shard file name");
    }
  }
  return root;
}

std::optional<uint64_t> declared_total_size(const json& root, const std::string& where) {
  const auto meta = root.find("metadata");
  if (meta == root.end() || meta->is_null()) return std::nullopt;
  if (!meta->is_object()) fail_invalid(where + ": \"metadata\" is not an object");
  const auto total = meta->find("total_size");
  if (total == meta->end()) return std::nullopt;
  if (!total->is_number_unsigned()) {
    fail_invalid(where + ": metadata.total_size " + total->dump() +
                 " is not a non-negative integer");
  }
  return total->get<uint64_t>();
}

}  // namespace

Graph import_safetensors_index(const fs::path& index_path) {
  // Appended rather than "'" + ...: GCC 12 warns falsely (-Wrestrict) on that form here.
  std::string where = "'";
  where += index_path.string();
  where += '\'';
  const json root = read_index_json(index_path, where);
  const fs::path folder = index_path.has_parent_path() ? index_path.parent_path() : fs::path(".");

  // Shard file name -> tensors the index puts there; std::map sorts shards by name.
  std::map<std::string, std::set<std::string>> listed;
  std::map<std::string, fs::path> resolved;
  for (const auto& [tensor, shard_json] : root["weight_map"].items()) {
    const auto& shard = shard_json.get_ref<const std::string&>();
    if (!resolved.contains(shard)) resolved[shard] = resolve_shard(folder, shard, tensor, where);
    listed[shard].insert(tensor);
  }

  Graph graph;
  graph.set_metadata("source_format", "safetensors");
  graph.set_metadata("source_path", index_path.string());
  std::map<std::string, std::string> found_in;  // tensor -> shard it was read from
  uint64_t total_bytes = 0;
  for (const auto& [shard, path] : resolved) {
    Graph part = import_safetensors(path);
    for (const auto& [name, tensor] : part.initializers()) {
      if (const auto seen = found_in.find(name); seen != found_in.end()) {
        fail_invalid(where + ": tensor '" + name + "' is in both shard '" + seen->second +
                     "' and shard '" + shard + "'; remove one copy");
      }
      if (!listed[shard].contains(name)) {
        fail_invalid(where + ": tensor '" + name + "' in shard '" + shard +
                     "' is not mapped to that shard by weight_map; the index is stale");
      }
      found_in[name] = shard;
      total_bytes += tensor.nbytes();
      graph.set_initializer(name, tensor);
    }
    for (const auto& [key, value] : part.metadata) {
      if (key.starts_with("safetensors.") && graph.find_metadata(key) == nullptr) {
        graph.set_metadata(key, value);
      }
    }
  }
  for (const auto& [shard, names] : listed) {
    for (const auto& name : names) {
      if (!found_in.contains(name)) {
        fail_invalid(where + ": tensor '" + name + "' is mapped to shard '" + shard +
                     "' but that shard does not hold it; the index or the shard is wrong");
      }
    }
  }
  if (const auto declared = declared_total_size(root, where);
      declared && *declared != total_bytes) {
    spdlog::warn("{}: metadata.total_size is {} but the shards' tensors hold {} bytes", where,
                 *declared, total_bytes);
  }
  return graph;
}

}  // namespace qforge
