// Interop with the reference implementation: files written by safetensors.torch.save_file are
// read exactly, files qforge writes are read by safetensors.safe_open, and qforge's output is
// byte-identical to save_file's. Needs QFORGE_PYTHON: a Python with torch and safetensors.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "exporters/safetensors/safetensors_writer.h"
#include "importers/safetensors/safetensors_reader.h"
#include "tests/unit/importers/safetensors/safetensors_test_util.h"

using namespace qforge;

namespace {

// The Python fixtures are written once for the suite: starting Python with torch takes seconds.
class SafetensorsInterop : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const char* python = std::getenv("QFORGE_PYTHON");
    if (python == nullptr || *python == '\0') return;
    python_ = python;
    dir_ = std::filesystem::temp_directory_path() /
           ("qforge_SafetensorsInterop_" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    fixtures_ok_ = script("write", {dir_.string()}) == 0;
  }
  static void TearDownTestSuite() {
    std::error_code ec;
    if (!dir_.empty()) std::filesystem::remove_all(dir_, ec);
  }
  void SetUp() override {
    if (python_.empty()) {
      GTEST_SKIP() << "QFORGE_PYTHON not set: point it at a Python with torch and safetensors "
                      "(e.g. QFORGE_PYTHON=.venv/bin/python) to run the interop tests";
    }
    ASSERT_TRUE(fixtures_ok_) << "tests/interop/fixtures/make_safetensors.py write failed";
  }

  // Runs tests/interop/fixtures/make_safetensors.py; returns its exit status.
  static int script(const std::string& mode, const std::vector<std::string>& args) {
    std::string cmd = "'" + python_ +
                      "' '" QFORGE_SOURCE_DIR "/tests/interop/fixtures/make_safetensors.py' " +
                      mode;
    for (const auto& a : args) cmd.append(" '").append(a).append("'");
    const int status = std::system(cmd.c_str());
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

  static nlohmann::json expected() {
    std::ifstream f(dir_ / "expected.json");
    return nlohmann::json::parse(f);
  }

  // A scratch folder for the running test inside the suite's folder (removed with it).
  static std::filesystem::path out_dir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    const auto d = dir_ / info->name();
    std::filesystem::create_directories(d);
    return d;
  }

  static inline std::string python_;
  static inline std::filesystem::path dir_;
  static inline bool fixtures_ok_ = false;
};

}  // namespace

TEST_F(SafetensorsInterop, ReadsPythonWrittenFiles) {
  const Graph g = import_safetensors(dir_ / "py_meta.safetensors");
  const auto want = expected();
  ASSERT_EQ(g.initializers().size(), want["tensors"].size());
  for (const auto& [name, w] : want["tensors"].items()) {
    const Tensor* t = g.find_initializer(name);
    ASSERT_NE(t, nullptr) << name;
    EXPECT_EQ(dtype_name(t->dtype()), w["dtype"].get<std::string>()) << name;
    EXPECT_EQ(t->shape(), w["shape"].get<Shape>()) << name;
    const auto raw = test::read_bytes(dir_ / w["raw"].get<std::string>());
    EXPECT_TRUE(std::equal(raw.begin(), raw.end(), t->bytes().begin(), t->bytes().end())) << name;
    EXPECT_TRUE(t->is_mapped()) << name;
  }
  for (const auto& [key, value] : want["metadata"].items()) {
    const std::string* got = g.find_metadata("safetensors." + key);
    ASSERT_NE(got, nullptr) << key;
    EXPECT_EQ(*got, value.get<std::string>()) << key;
  }
}

TEST_F(SafetensorsInterop, PythonReadsQforgeFiles) {
  const auto out = out_dir() / "ours.safetensors";
  export_safetensors(import_safetensors(dir_ / "py_meta.safetensors"), out);
  EXPECT_EQ(script("check", {dir_.string(), out.string()}), 0);
}

TEST_F(SafetensorsInterop, PythonReadsQforgeShards) {
  const auto out = out_dir();
  export_safetensors(import_safetensors(dir_ / "py_meta.safetensors"), out / "model.safetensors",
                     {.max_shard_size = 100});
  EXPECT_GT(test::folder_listing(out).size(), 3u);  // 380 bytes of tensors: several shards
  EXPECT_EQ(script("check", {dir_.string(), (out / "model.safetensors.index.json").string()}), 0);
}

TEST_F(SafetensorsInterop, WritesWhatSaveFileWritesByteForByte) {
  const auto out = out_dir() / "ours.safetensors";
  export_safetensors(import_safetensors(dir_ / "py_plain.safetensors"), out);
  EXPECT_EQ(test::read_bytes(out), test::read_bytes(dir_ / "py_plain.safetensors"));
}
