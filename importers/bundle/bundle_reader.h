#pragma once
// Reads an engine bundle (exporters/bundle/bundle_writer.h) and checks it before anything in
// it is used: manifest.json is parsed strictly (valid UTF-8, no duplicate keys, format
// "qforge-bundle", version 1), every file it lists must resolve inside the bundle folder (no
// absolute path, no '..', no link leading out) and have the listed size and SHA-256. Files the
// manifest does not list are reported (a warning, not an error).
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "ir/graph.h"

namespace qforge {

enum class BundleFileState {
  Ok,        // present, size and SHA-256 as listed
  Missing,   // listed, not in the folder
  Modified,  // listed, size or SHA-256 differ from the manifest
  Unlisted,  // in the folder, not in the manifest (a warning)
};
std::string_view bundle_file_state_name(BundleFileState state);  // "ok", "missing", ...

struct BundleFileStatus {
  std::string name;  // relative to the bundle folder, '/'-separated
  BundleFileState state = BundleFileState::Ok;
  uint64_t size = 0;    // listed size (Unlisted: actual size)
  std::string sha256;   // listed digest (Unlisted: empty)
  std::string message;  // one line for Missing, Modified, Unlisted; empty when Ok
};

struct VerifyResult {
  std::filesystem::path dir;
  nlohmann::json manifest;
  std::vector<BundleFileStatus> files;  // listed files in manifest order, then unlisted ones
  // True when every listed file is Ok (unlisted files do not count).
  bool ok() const;
  // The message of the first Missing or Modified file; empty when ok().
  std::string first_problem() const;
};

struct LoadedBundle {
  std::filesystem::path dir;
  nlohmann::json manifest;
  Graph graph;                        // model.onnx
  std::vector<std::string> warnings;  // unlisted files (also logged)
};

// Throws Error: IO when the folder or manifest cannot be read; InvalidInput for a malformed
// manifest, a listed path that leaves the folder, or (verify_bundle never) a file that is
// missing or modified; Unsupported for a newer manifest version.
VerifyResult verify_bundle(const std::filesystem::path& dir);

// verify_bundle, then InvalidInput naming the first missing or modified file, then
// import_onnx of model.onnx. Unlisted files are logged as warnings.
LoadedBundle open_bundle(const std::filesystem::path& dir);

// True when `path` is a folder holding manifest.json (what `qforge run` treats as a bundle).
bool looks_like_bundle(const std::filesystem::path& path);

}  // namespace qforge
