#include "exporters/safetensors/safetensors_writer.h"

#include <cstdio>
#include <memory>

#include <nlohmann/json.hpp>

#include "exporters/atomic_file.h"
#include "exporters/safetensors/safetensors_file_writer.h"
#include "ir/error.h"

namespace qforge {

namespace {

using safetensors_out::OutTensor;
using Metadata = std::map<std::string, std::string>;

Metadata header_metadata(const Graph& weights, const SafetensorsWriteOptions& options) {
  Metadata metadata;
  if (options.keep_metadata) {
    constexpr std::string_view kPrefix = "safetensors.";
    for (const auto& [key, value] : weights.metadata) {
      if (!key.starts_with(kPrefix)) continue;
      const std::string plain = key.substr(kPrefix.size());
      // format comes from the options; packed-tensor entries are rebuilt from the tensors.
      if (plain == "format" || plain.starts_with(safetensors_out::kPackedDTypePrefix) ||
          plain.starts_with(safetensors_out::kPackedShapePrefix)) {
        continue;
      }
      metadata[plain] = value;
    }
  }
  if (!options.format.empty()) metadata["format"] = options.format;
  return metadata;
}

std::vector<OutTensor> collect_tensors(const Graph& weights, const std::filesystem::path& out) {
  std::vector<OutTensor> tensors;
  for (const auto& [name, tensor] : weights.initializers()) {
    if (name == "__metadata__") {
      fail_invalid("cannot write '" + out.string() +
                   "': a tensor named '__metadata__' clashes with the header's metadata entry; "
                   "rename it");
    }
    if (tensor.empty()) {
      fail_invalid("cannot write '" + out.string() + "': tensor '" + name + "' has no data");
    }
    tensors.push_back({name, &tensor});
  }
  return tensors;
}

// Shards filled in graph order; a tensor that does not fit in the current shard starts the
// next one, so one larger than the limit ends up alone.
std::vector<std::vector<OutTensor>> split_shards(const std::vector<OutTensor>& tensors,
                                                 uint64_t max_shard_size) {
  std::vector<std::vector<OutTensor>> shards;
  uint64_t filled = 0;
  for (const auto& t : tensors) {
    const uint64_t size = t.tensor->nbytes();
    if (shards.empty() || (!shards.back().empty() && filled + size > max_shard_size)) {
      shards.emplace_back();
      filled = 0;
    }
    shards.back().push_back(t);
    filled += size;
  }
  return shards;
}

std::string shard_name(const std::filesystem::path& out, size_t index, size_t count) {
  char numbers[32];
  std::snprintf(numbers, sizeof numbers, "-%05zu-of-%05zu", index + 1, count);
  return out.stem().string() + numbers + out.extension().string();
}

void write_text(const std::filesystem::path& path, const std::string& text) {
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> file(std::fopen(path.c_str(), "wb"),
                                                       &std::fclose);
  if (!file || std::fwrite(text.data(), 1, text.size(), file.get()) != text.size() ||
      std::fclose(file.release()) != 0) {
    fail_io("cannot write '" + path.string() + "'");
  }
}

}  // namespace

void export_safetensors(const Graph& weights, const std::filesystem::path& out,
                        const SafetensorsWriteOptions& options) {
  const auto tensors = collect_tensors(weights, out);
  const Metadata metadata = header_metadata(weights, options);
  const auto shards = options.max_shard_size == 0 ? std::vector<std::vector<OutTensor>>{tensors}
                                                  : split_shards(tensors, options.max_shard_size);
  if (shards.size() <= 1) {
    AtomicFile file(out);
    safetensors_out::write_safetensors_file(file.temp_path(), tensors, metadata);
    file.commit();
    return;
  }

  // Every file is complete before any is renamed into place; the index goes last.
  std::vector<std::unique_ptr<AtomicFile>> files;
  nlohmann::json weight_map = nlohmann::json::object();
  uint64_t total_size = 0;
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::string name = shard_name(out, i, shards.size());
    files.push_back(std::make_unique<AtomicFile>(out.parent_path() / name));
    safetensors_out::write_safetensors_file(files.back()->temp_path(), shards[i], metadata);
    for (const auto& t : shards[i]) {
      weight_map[t.name] = name;
      total_size += t.tensor->nbytes();
    }
  }
  const nlohmann::json index = {{"metadata", {{"total_size", total_size}}},
                                {"weight_map", std::move(weight_map)}};
  // json.dumps(index, indent=2, sort_keys=True) + "\n", as save_pretrained writes it.
  files.push_back(std::make_unique<AtomicFile>(out.string() + ".index.json"));
  write_text(files.back()->temp_path(), index.dump(2, ' ', /*ensure_ascii=*/true) + "\n");
  for (auto& f : files) f->commit();
}

}  // namespace qforge
