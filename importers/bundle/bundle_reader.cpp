#include "importers/bundle/bundle_reader.h"

#include <algorithm>
#include <fstream>
#include <set>

#include <spdlog/spdlog.h>

#include "ir/sha256.h"
#include "importers/onnx/onnx_importer.h"
#include "importers/safetensors/strict_json.h"
#include "ir/error.h"

namespace qforge {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// Kept equal to exporters/bundle/bundle_writer.h (importers do not include exporters).
constexpr std::string_view kFormat = "qforge-bundle";
constexpr int64_t kVersion = 1;
constexpr uintmax_t kMaxManifestBytes = 64u << 20;

std::string bundle_where(const fs::path& dir) { return "bundle '" + dir.string() + "'"; }

json read_manifest(const fs::path& dir) {
  const std::string where = bundle_where(dir);
  const fs::path path = dir / "manifest.json";
  std::error_code ec;
  if (!fs::exists(dir, ec)) fail_io(where + " does not exist; check the path");
  if (!fs::is_directory(dir, ec)) {
    fail_invalid(where + " is not a folder; give the NAME.qfb folder that convert wrote");
  }
  if (!fs::is_regular_file(path, ec)) {
    fail_invalid(where + " has no manifest.json; not a qforge bundle (or an incomplete copy)");
  }
  const uintmax_t size = fs::file_size(path, ec);
  if (ec) fail_io(where + ": cannot read manifest.json: " + ec.message());
  if (size > kMaxManifestBytes) {
    fail_invalid(where + ": manifest.json is " + std::to_string(size) +
                 " bytes, over the 64 MiB limit; the bundle is corrupt");
  }
  std::ifstream in(path, std::ios::binary);
  std::string text(size, '\0');
  in.read(text.data(), static_cast<std::streamsize>(size));
  if (!in) fail_io(where + ": cannot read manifest.json");
  json m = safetensors_detail::parse_strict_json(text, where + ": manifest.json", "key");
  if (!m.is_object()) {
    fail_invalid(where + ": manifest.json is a JSON " + std::string(m.type_name()) +
                 ", expected an object; the bundle is corrupt");
  }
  const auto format = m.find("format");
  if (format == m.end() || !format->is_string() || *format != kFormat) {
    fail_invalid(where +
                 ": manifest.json has no \"format\": \"qforge-bundle\"; not a qforge bundle");
  }
  const auto version = m.find("version");
  if (version == m.end() || !version->is_number_integer()) {
    fail_invalid(where + ": manifest.json has no integer \"version\"; the bundle is corrupt");
  }
  if (version->get<int64_t>() != kVersion) {
    if (version->get<int64_t>() > kVersion) {
      fail_unsupported(where + " has format version " + std::to_string(version->get<int64_t>()) +
                       "; this qforge reads version 1: upgrade qforge");
    }
    fail_invalid(where + " has format version " + std::to_string(version->get<int64_t>()) +
                 "; only version 1 exists; the bundle is corrupt");
  }
  const auto files = m.find("files");
  if (files == m.end() || !files->is_array()) {
    fail_invalid(where + ": manifest.json has no \"files\" list; the bundle is corrupt");
  }
  return m;
}

bool is_hex64(const std::string& s) {
  return s.size() == 64 && std::all_of(s.begin(), s.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

// A listed name must be a relative path that stays inside the folder, also once every link on
// the way is followed (the pattern of ONNX external data and safetensors shards).
fs::path resolve_listed(const fs::path& dir, const fs::path& canonical_dir, const std::string& name,
                        const std::string& where) {
  const fs::path rel(name);
  const std::string what = where + ": manifest entry '" + name + "'";
  if (rel.has_root_path()) {
    fail_invalid(what + " is an absolute path; bundle files must be named relative to the folder");
  }
  for (const auto& part : rel) {
    if (part == "..") fail_invalid(what + " uses '..'; bundle files must lie inside the folder");
  }
  std::error_code ec;
  const fs::path full = fs::weakly_canonical(dir / rel, ec);
  if (ec) fail_io(what + " cannot be resolved: " + ec.message());
  const fs::path inside = full.lexically_relative(canonical_dir);
  if (inside.empty() || *inside.begin() == ".." || inside == ".") {
    fail_invalid(what + " links to '" + full.string() +
                 "', outside the bundle folder; the bundle was tampered with");
  }
  return full;
}

std::string short_hex(const std::string& hex) { return hex.substr(0, 12) + "…"; }

}  // namespace

std::string_view bundle_file_state_name(BundleFileState state) {
  switch (state) {
    case BundleFileState::Ok:
      return "ok";
    case BundleFileState::Missing:
      return "missing";
    case BundleFileState::Modified:
      return "modified";
    case BundleFileState::Unlisted:
      return "unlisted";
  }
  return "?";
}

bool VerifyResult::ok() const {
  return std::none_of(files.begin(), files.end(), [](const BundleFileStatus& f) {
    return f.state == BundleFileState::Missing || f.state == BundleFileState::Modified;
  });
}

std::string VerifyResult::first_problem() const {
  for (const auto& f : files) {
    if (f.state == BundleFileState::Missing || f.state == BundleFileState::Modified) {
      return f.message;
    }
  }
  return {};
}

VerifyResult verify_bundle(const fs::path& dir_in) {
  fs::path dir = dir_in;
  if (dir.filename().empty()) dir = dir.parent_path();
  const std::string where = bundle_where(dir);
  VerifyResult result;
  result.dir = dir;
  result.manifest = read_manifest(dir);
  std::error_code ec;
  const fs::path canonical_dir = fs::canonical(dir, ec);
  if (ec) fail_io(where + ": cannot resolve the folder: " + ec.message());

  std::set<fs::path> listed;
  for (const auto& entry : result.manifest["files"]) {
    const auto name = entry.is_object() ? entry.find("name") : entry.end();
    const auto size = entry.is_object() ? entry.find("size") : entry.end();
    const auto sha = entry.is_object() ? entry.find("sha256") : entry.end();
    if (name == entry.end() || !name->is_string() || name->get<std::string>().empty() ||
        size == entry.end() || !size->is_number_unsigned() || sha == entry.end() ||
        !sha->is_string() || !is_hex64(sha->get<std::string>())) {
      fail_invalid(where + ": manifest entry " + entry.dump() +
                   " needs \"name\", an unsigned \"size\" and a 64-digit lowercase hex "
                   "\"sha256\"; the bundle is corrupt");
    }
    BundleFileStatus f;
    f.name = name->get<std::string>();
    f.size = size->get<uint64_t>();
    f.sha256 = sha->get<std::string>();
    if (f.name == "manifest.json") {
      fail_invalid(where + ": manifest.json lists itself; the bundle is corrupt");
    }
    const fs::path full = resolve_listed(dir, canonical_dir, f.name, where);
    if (!listed.insert(full).second) {
      fail_invalid(where + ": manifest lists '" + f.name + "' twice; the bundle is corrupt");
    }
    const std::string what = where + ": file '" + f.name + "'";
    if (!fs::is_regular_file(full, ec)) {
      f.state = BundleFileState::Missing;
      f.message = what + " is missing; the bundle is incomplete, copy it again or rebuild it";
    } else if (const uintmax_t actual = fs::file_size(full, ec); actual != f.size) {
      f.state = BundleFileState::Modified;
      f.message = what + " is " + std::to_string(actual) + " bytes but the manifest says " +
                  std::to_string(f.size) + "; the bundle was modified after it was written";
    } else if (const std::string digest = sha256_file_hex(full, what); digest != f.sha256) {
      f.state = BundleFileState::Modified;
      f.message = what + " has sha256 " + short_hex(digest) + " but the manifest says " +
                  short_hex(f.sha256) + "; the bundle was modified after it was written";
    }
    result.files.push_back(std::move(f));
  }

  std::vector<BundleFileStatus> unlisted;
  for (const auto& entry : fs::recursive_directory_iterator(dir)) {
    if (entry.is_directory()) continue;
    const fs::path rel = entry.path().lexically_relative(dir);
    if (rel == "manifest.json") continue;
    const fs::path full = fs::weakly_canonical(entry.path(), ec);
    if (listed.count(full) != 0) continue;
    BundleFileStatus f;
    f.name = rel.generic_string();
    f.state = BundleFileState::Unlisted;
    f.size = entry.is_regular_file() ? fs::file_size(entry.path(), ec) : 0;
    f.message = where + ": file '" + f.name +
                "' is not listed in the manifest and was not checked; it is ignored";
    unlisted.push_back(std::move(f));
  }
  std::sort(unlisted.begin(), unlisted.end(),
            [](const auto& a, const auto& b) { return a.name < b.name; });
  for (auto& f : unlisted) result.files.push_back(std::move(f));
  return result;
}

LoadedBundle open_bundle(const fs::path& dir) {
  VerifyResult verified = verify_bundle(dir);
  if (!verified.ok()) fail_invalid(verified.first_problem());
  const auto model = std::find_if(verified.files.begin(), verified.files.end(),
                                  [](const auto& f) { return f.name == "model.onnx"; });
  if (model == verified.files.end() || model->state != BundleFileState::Ok) {
    fail_invalid(bundle_where(verified.dir) +
                 ": manifest lists no model.onnx; the bundle is corrupt");
  }
  LoadedBundle loaded;
  loaded.dir = verified.dir;
  for (const auto& f : verified.files) {
    if (f.state == BundleFileState::Unlisted) {
      spdlog::warn("{}", f.message);
      loaded.warnings.push_back(f.message);
    }
  }
  loaded.graph = import_onnx(verified.dir / "model.onnx");
  loaded.manifest = std::move(verified.manifest);
  return loaded;
}

bool looks_like_bundle(const fs::path& path) {
  std::error_code ec;
  return fs::is_directory(path, ec) && fs::exists(path / "manifest.json", ec);
}

}  // namespace qforge
