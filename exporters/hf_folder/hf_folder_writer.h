#pragma once
// Writes a Hugging Face model folder, the shape save_pretrained gives: config.json and the
// tokenizer and generation files copied unchanged from the source folder, the weights as
// safetensors (model.safetensors, or model-0000N-of-0000M.safetensors shards with
// model.safetensors.index.json). The folder is built under a temporary name beside the target
// and renamed into place once complete, so a failure leaves nothing behind.
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "ir/graph.h"

namespace qforge {

struct HfFolderWriteOptions {
  // The model folder the weights came from; its config, tokenizer and generation files are
  // copied. Empty: only the weights are written.
  std::filesystem::path source_dir;
  // Bytes of tensor data per shard (transformers' default is 5 GB); 0 writes one file.
  uint64_t max_shard_size = 5'000'000'000;
  bool overwrite = false;  // replace an existing folder
};

// The files of a model folder copied unchanged: config.json, generation_config.json, the
// tokenizer's files (tokenizer.json, tokenizer_config.json, special_tokens_map.json,
// added_tokens.json, vocab.json, vocab.txt, merges.txt, chat templates, *.model, *.tiktoken).
bool is_hf_side_file(const std::string& name);

// The side files (is_hf_side_file) of `source_dir`, in name order; none for an empty path.
std::vector<std::string> list_hf_side_files(const std::filesystem::path& source_dir);

// `dir` without its trailing slash, checked as write_hf_folder checks it: Usage when it exists
// and overwrite is false (or is not a folder), IO when its parent is missing. `exists` says
// whether a folder is there to be replaced.
std::filesystem::path check_hf_folder_target(const std::filesystem::path& dir, bool overwrite,
                                             bool& exists);

// Throws Usage when `dir` exists and overwrite is false, IO when its parent folder is missing
// or a file cannot be read or written.
void write_hf_folder(const Graph& weights, const std::filesystem::path& dir,
                     const HfFolderWriteOptions& options);

}  // namespace qforge
