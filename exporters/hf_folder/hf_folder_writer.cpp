#include "exporters/hf_folder/hf_folder_writer.h"

#include <algorithm>
#include <string_view>
#include <vector>

#include "exporters/atomic_folder.h"
#include "exporters/safetensors/safetensors_writer.h"
#include "ir/error.h"

namespace qforge {

namespace {

namespace fs = std::filesystem;

constexpr std::string_view kSideFiles[] = {
    "config.json",          "generation_config.json", "tokenizer.json",
    "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
    "vocab.json",           "vocab.txt",              "merges.txt",
    "chat_template.jinja",  "chat_template.json",     "preprocessor_config.json",
};

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

}  // namespace

bool is_hf_side_file(const std::string& name) {
  return std::find(std::begin(kSideFiles), std::end(kSideFiles), name) != std::end(kSideFiles) ||
         ends_with(name, ".model") || ends_with(name, ".tiktoken");
}

fs::path check_hf_folder_target(const fs::path& dir_in, bool overwrite, bool& exists) {
  fs::path dir = dir_in;
  if (dir.filename().empty()) dir = dir.parent_path();  // "out/" names the folder out
  const fs::path parent = dir.parent_path().empty() ? fs::path(".") : dir.parent_path();
  std::error_code ec;
  if (!fs::is_directory(parent, ec)) {
    fail_io("output folder '" + parent.string() + "' does not exist: create it first");
  }
  exists = fs::symlink_status(dir, ec).type() != fs::file_type::not_found && !ec;
  if (exists && !overwrite) {
    fail_usage("output folder '" + dir.string() +
               "' already exists; remove it, choose another name, or pass --overwrite");
  }
  if (exists && !fs::is_directory(fs::symlink_status(dir, ec))) {
    fail_usage("output '" + dir.string() + "' exists and is not a folder");
  }
  return dir;
}

std::vector<std::string> list_hf_side_files(const fs::path& source_dir) {
  // In name order, so that the same inputs always give the same folder.
  std::vector<std::string> side;
  if (source_dir.empty()) return side;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(source_dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (is_hf_side_file(name) && fs::is_regular_file(entry.path(), ec)) side.push_back(name);
  }
  if (ec) fail_io("cannot list '" + source_dir.string() + "': " + ec.message());
  std::sort(side.begin(), side.end());
  return side;
}

void write_hf_folder(const Graph& weights, const fs::path& dir_in,
                     const HfFolderWriteOptions& options) {
  bool exists = false;
  const fs::path dir = check_hf_folder_target(dir_in, options.overwrite, exists);
  const std::vector<std::string> side = list_hf_side_files(options.source_dir);
  std::error_code ec;
  AtomicFolder folder(dir, exists, "folder");
  const fs::path& temp = folder.temp_path();
  for (const auto& name : side) {
    if (!fs::copy_file(options.source_dir / name, temp / name, ec) || ec) {
      fail_io("cannot copy '" + (options.source_dir / name).string() + "' to '" +
              (temp / name).string() + "': " + ec.message());
    }
  }
  SafetensorsWriteOptions st;
  st.max_shard_size = options.max_shard_size;
  export_safetensors(weights, temp / "model.safetensors", st);
  folder.commit();
}

}  // namespace qforge
