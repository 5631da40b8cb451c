// Sharded torch checkpoints: pytorch_model.bin.index.json names, for every tensor, the shard
// (a torch.save file beside the index) that holds it.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <system_error>

#include "importers/torch/byte_io.h"
#include "importers/torch/torch_archive.h"
#include "importers/torch/torch_reader.h"
#include "ir/error.h"

namespace qforge {

using torch_detail::printable;
using torch_detail::quote;

namespace {

constexpr uintmax_t kMaxIndexBytes = uintmax_t{64} << 20;

nlohmann::json read_index(const std::filesystem::path& path) {
  const std::string file = quote(path.string());
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  if (ec) fail_io("cannot read " + file + ": " + ec.message());
  if (size > kMaxIndexBytes) {
    fail_invalid(file + " is " + std::to_string(size) + " bytes, more than an index should be (" +
                 std::to_string(kMaxIndexBytes) +
                 "); is it really a pytorch_model.bin.index.json?");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) fail_io("cannot open " + file);
  std::stringstream text;
  text << in.rdbuf();
  try {
    return nlohmann::json::parse(text.str());
  } catch (const nlohmann::json::parse_error& e) {
    fail_invalid(file + " is not valid JSON (byte " + std::to_string(e.byte) +
                 "); expected a pytorch_model.bin.index.json");
  }
}

// The shard's path, which must stay inside the index's folder: no absolute path, no "..",
// no link leading out.
std::filesystem::path shard_path(const std::filesystem::path& folder, const std::string& shard,
                                 const std::string& file) {
  const std::filesystem::path rel(shard);
  bool escapes = shard.empty() || rel.is_absolute() || rel.has_root_name();
  for (const auto& part : rel) escapes |= part == "..";
  std::error_code ec;
  const auto root = std::filesystem::weakly_canonical(folder, ec);
  const auto full = std::filesystem::weakly_canonical(folder / rel, ec);
  if (!escapes && !ec) {
    const auto mismatch = std::mismatch(root.begin(), root.end(), full.begin(), full.end());
    escapes = mismatch.first != root.end();
  }
  if (escapes || ec) {
    fail_invalid(file + " names shard '" + printable(shard) +
                 "', which is not a file inside the index's folder; shards must sit beside "
                 "the index");
  }
  return folder / rel;
}

}  // namespace

Graph import_torch_index(const std::filesystem::path& index_path) {
  const std::string file = quote(index_path.string());
  const nlohmann::json index = read_index(index_path);
  if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object()) {
    fail_invalid(file + " has no \"weight_map\" object; expected a pytorch_model.bin.index.json");
  }
  std::map<std::string, std::string> shard_of;             // tensor -> shard
  std::map<std::string, std::vector<std::string>> shards;  // shard -> tensors, sorted
  for (const auto& [name, shard] : index["weight_map"].items()) {
    if (!shard.is_string()) {
      fail_invalid(file + ": weight_map entry '" + printable(name) + "' is not a file name");
    }
    shard_of[name] = shard.get<std::string>();
    shards[shard.get<std::string>()].push_back(name);
  }

  Graph graph;
  graph.name = index_path.stem().string();
  const auto folder = index_path.parent_path();
  for (const auto& [shard, names] : shards) {
    const auto path = shard_path(folder, shard, file);
    for (auto& [name, tensor] : torch_detail::read_torch_archive(path)) {
      const auto it = shard_of.find(name);
      if (it == shard_of.end() || it->second != shard) {
        spdlog::debug("torch: skipping '{}' in shard '{}': the index does not map it there",
                      printable(name), printable(shard));
        continue;
      }
      graph.set_initializer(name, std::move(tensor));
    }
    for (const auto& name : names) {
      if (!graph.has_initializer(name)) {
        fail_invalid(file + " maps tensor '" + printable(name) + "' to shard '" + printable(shard) +
                     "', which does not hold it; the checkpoint is "
                     "incomplete or its index is stale");
      }
    }
  }
  graph.set_metadata("source_format", "torch");
  graph.set_metadata("source_path", index_path.string());
  graph.set_metadata("shards", std::to_string(shards.size()));
  return graph;
}

}  // namespace qforge
