#include <gtest/gtest.h>

#include "importers/bundle/bundle_reader.h"
#include "runtime/executor.h"
#include "tests/unit/exporters/bundle/bundle_test_util.h"

namespace qforge::testing {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// A fresh bundle tmp/m.qfb written from qdq_graph().
fs::path make_bundle(const TempDir& tmp) {
  write_bundle(qdq_graph(), tmp / "m.qfb", sample_info(tmp));
  return tmp / "m.qfb";
}

const BundleFileStatus& status_of(const VerifyResult& r, const std::string& name) {
  for (const auto& f : r.files) {
    if (f.name == name) return f;
  }
  ADD_FAILURE() << name << " not in the verify result";
  return r.files.front();
}

void edit_manifest(const fs::path& bundle, const std::function<void(json&)>& edit) {
  json m = read_json(bundle / "manifest.json");
  edit(m);
  write_json(bundle / "manifest.json", m);
}

TEST(BundleReader, OpensWhatTheWriterWrote) {
  TempDir tmp;
  const fs::path dir = make_bundle(tmp);
  const VerifyResult v = verify_bundle(dir);
  EXPECT_TRUE(v.ok());
  ASSERT_EQ(v.files.size(), 4u);
  for (const auto& f : v.files) EXPECT_EQ(f.state, BundleFileState::Ok) << f.name;
  const LoadedBundle b = open_bundle(dir);
  EXPECT_TRUE(b.warnings.empty());
  EXPECT_EQ(b.manifest["quantization"]["scheme"], "int8-weights");
  EXPECT_EQ(b.graph.nodes.size(), qdq_graph().nodes.size());
  EXPECT_TRUE(b.graph.find_initializer("W")->equals(*qdq_graph().find_initializer("W")));
}

TEST(BundleReader, BundleRunsLikeItsGraph) {
  TempDir tmp;
  const LoadedBundle b = open_bundle(make_bundle(tmp));
  const Tensor x = f32_tensor({1, 2, 3, 4, -1, 0, 0.5f, 2}, {2, 4});
  const auto expected = Executor(qdq_graph()).run({{"x", x}});
  const auto got = Executor(b.graph).run({{"x", x}});
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].shape(), (Shape{2, 3}));
  EXPECT_EQ(got[0].to_f32(), expected[0].to_f32());
}

TEST(BundleReader, TamperedFileIsNamed) {
  TempDir tmp;
  const fs::path dir = make_bundle(tmp);
  std::string bytes = read_bytes(dir / "weights.safetensors");
  bytes[bytes.size() - 1] = static_cast<char>(bytes.back() ^ 0x01);  // same size, new digest
  write_bytes(dir / "weights.safetensors", bytes);
  const VerifyResult v = verify_bundle(dir);
  EXPECT_FALSE(v.ok());
  EXPECT_EQ(status_of(v, "weights.safetensors").state, BundleFileState::Modified);
  EXPECT_EQ(status_of(v, "model.onnx").state, BundleFileState::Ok);
  expect_error([&] { open_bundle(dir); }, ErrorCategory::InvalidInput,
               {"m.qfb", "file 'weights.safetensors' has sha256", "but the manifest says",
                "modified after it was written"});
}

TEST(BundleReader, ResizedFileIsNamed) {
  TempDir tmp;
  const fs::path dir = make_bundle(tmp);
  write_bytes(dir / "report.json", read_bytes(dir / "report.json") + " ");
  EXPECT_EQ(status_of(verify_bundle(dir), "report.json").state, BundleFileState::Modified);
  expect_error([&] { open_bundle(dir); }, ErrorCategory::InvalidInput,
               {"'report.json'", "bytes but the manifest says"});
}

TEST(BundleReader, MissingFileIsNamed) {
  TempDir tmp;
  const fs::path dir = make_bundle(tmp);
  fs::remove(dir / "calibration.cache");
  const VerifyResult v = verify_bundle(dir);
  EXPECT_FALSE(v.ok());
  EXPECT_EQ(status_of(v, "calibration.cache").state, BundleFileState::Missing);
  expect_error([&] { open_bundle(dir); }, ErrorCategory::InvalidInput,
               {"'calibration.cache'", "is missing"});
}

TEST(BundleReader, UnlistedFileIsAWarning) {
  TempDir tmp;
  const fs::path dir = make_bundle(tmp);
  write_bytes(dir / "notes.txt", "hello");
  const VerifyResult v = verify_bundle(dir);
  EXPECT_TRUE(v.ok());
  EXPECT_EQ(status_of(v, "notes.txt").state, BundleFileState::Unlisted);
  const LoadedBundle b = open_bundle(dir);
  ASSERT_EQ(b.warnings.size(), 1u);
  EXPECT_NE(b.warnings[0].find("notes.txt"), std::string::npos) << b.warnings[0];
}

TEST(BundleReader, ListedPathsMustStayInsideTheFolder) {
  TempDir tmp;
  const fs::path dir = make_bundle(tmp);
  const json original = read_json(dir / "manifest.json");
  write_bytes(tmp / "outside", "x");
  edit_manifest(dir, [](json& m) { m["files"][0]["name"] = "../outside"; });
  expect_error([&] { verify_bundle(dir); }, ErrorCategory::InvalidInput, {"'../outside'", "'..'"});
  edit_manifest(dir, [&](json& m) { m["files"][0]["name"] = (tmp / "outside").string(); });
  expect_error([&] { verify_bundle(dir); }, ErrorCategory::InvalidInput, {"absolute path"});

  // A listed file that is a link to a copy outside the folder, digest and all.
  write_json(dir / "manifest.json", original);
  fs::rename(dir / "weights.safetensors", tmp / "weights.safetensors");
  fs::create_symlink(tmp / "weights.safetensors", dir / "weights.safetensors");
  expect_error([&] { open_bundle(dir); }, ErrorCategory::InvalidInput,
               {"'weights.safetensors'", "outside the bundle folder"});
}

TEST(BundleReader, LinkInsideTheFolderIsAccepted) {
  TempDir tmp;
  const fs::path dir = make_bundle(tmp);
  fs::create_directory(dir / "data");
  fs::rename(dir / "report.json", dir / "data" / "report.json");
  fs::create_symlink("data/report.json", dir / "report.json");
  const VerifyResult v = verify_bundle(dir);
  EXPECT_TRUE(v.ok()) << v.first_problem();
}

TEST(BundleReader, BadManifestIsRejected) {
  TempDir tmp;
  const fs::path dir = make_bundle(tmp);
  const json original = read_json(dir / "manifest.json");
  write_bytes(dir / "manifest.json", "{\"format\": ");
  expect_error([&] { verify_bundle(dir); }, ErrorCategory::InvalidInput, {"manifest.json"});
  write_bytes(dir / "manifest.json", R"({"format": "qforge-bundle", "format": "x"})");
  expect_error([&] { verify_bundle(dir); }, ErrorCategory::InvalidInput, {"format"});

  auto with = [&](const std::function<void(json&)>& edit) {
    json m = original;
    edit(m);
    write_json(dir / "manifest.json", m);
  };
  with([](json& m) { m["format"] = "other"; });
  expect_error([&] { verify_bundle(dir); }, ErrorCategory::InvalidInput, {"not a qforge bundle"});
  with([](json& m) { m["version"] = 2; });
  expect_error([&] { verify_bundle(dir); }, ErrorCategory::Unsupported,
               {"version 2", "upgrade qforge"});
  with([](json& m) { m["version"] = "1"; });
  expect_error([&] { verify_bundle(dir); }, ErrorCategory::InvalidInput, {"integer \"version\""});
  with([](json& m) { m["files"][1]["sha256"] = "ABC"; });
  expect_error([&] { verify_bundle(dir); }, ErrorCategory::InvalidInput, {"sha256"});
  with([](json& m) { m["files"][1]["size"] = -1; });
  expect_error([&] { verify_bundle(dir); }, ErrorCategory::InvalidInput, {"size"});
  with([](json& m) { m["files"].push_back(m["files"][0]); });
  expect_error([&] { verify_bundle(dir); }, ErrorCategory::InvalidInput, {"twice"});
  with([](json& m) { m.erase("files"); });
  expect_error([&] { verify_bundle(dir); }, ErrorCategory::InvalidInput, {"\"files\""});
  fs::remove(dir / "manifest.json");
  expect_error([&] { verify_bundle(dir); }, ErrorCategory::InvalidInput, {"no manifest.json"});
}

TEST(BundleReader, ModelMustBeListed) {
  TempDir tmp;
  const fs::path dir = make_bundle(tmp);
  edit_manifest(dir, [](json& m) {
    json kept = json::array();
    for (const auto& f : m["files"]) {
      if (f["name"] != "model.onnx") kept.push_back(f);
    }
    m["files"] = kept;
  });
  expect_error([&] { open_bundle(dir); }, ErrorCategory::InvalidInput, {"no model.onnx"});
}

TEST(BundleReader, LooksLikeBundle) {
  TempDir tmp;
  EXPECT_TRUE(looks_like_bundle(make_bundle(tmp)));
  EXPECT_FALSE(looks_like_bundle(tmp / "source.onnx"));
  EXPECT_FALSE(looks_like_bundle(tmp.path()));
}

}  // namespace
}  // namespace qforge::testing
