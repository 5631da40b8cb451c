// Checkpoints written by real PyTorch (tests/interop/fixtures/make_torch_checkpoints.py), read
// back byte for byte. Runs when QFORGE_PYTHON names a Python with torch installed.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>

#include "importers/torch/torch_reader.h"
#include "torch_test_util.h"

using namespace qforge;
using namespace qforge::torch_test;
namespace fs = std::filesystem;

namespace {

// torch's dtype names, mapped by hand (not by the reader's own table).
const std::map<std::string, DType> kTorchNames = {
    {"float32", DType::F32}, {"float16", DType::F16}, {"bfloat16", DType::BF16},
    {"float64", DType::F64}, {"int64", DType::I64},   {"int32", DType::I32},
    {"int16", DType::I16},   {"int8", DType::I8},     {"uint8", DType::U8},
    {"bool", DType::Bool}};

const std::map<std::string, ErrorCategory> kCategories = {
    {"InvalidInput", ErrorCategory::InvalidInput}, {"Unsupported", ErrorCategory::Unsupported}};

std::string read_text(const fs::path& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

class TorchInterop : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const char* python = std::getenv("QFORGE_PYTHON");
    if (python == nullptr || *python == '\0') return;
    out_ = fs::temp_directory_path() / ("qforge_torch_interop_" + std::to_string(::getpid()));
    fs::remove_all(out_);
    fs::create_directories(out_);
    const std::string script =
        std::string(QFORGE_SOURCE_DIR) + "/tests/interop/fixtures/make_torch_checkpoints.py";
    std::string command;
    for (const std::string& arg : {std::string(python), script, out_.string()}) {
      command += "'" + arg + "' ";
    }
    command += "> '" + (out_ / "log.txt").string() + "' 2>&1";
    script_status_ = std::system(command.c_str());
    if (script_status_ == 0) manifest_ = nlohmann::json::parse(read_text(out_ / "manifest.json"));
  }
  static void TearDownTestSuite() {
    std::error_code ec;
    if (!out_.empty()) fs::remove_all(out_, ec);
  }
  void SetUp() override {
    if (out_.empty()) {
      GTEST_SKIP() << "QFORGE_PYTHON not set: set it to a Python with torch to read real "
                      "torch.save checkpoints";
    }
    ASSERT_EQ(script_status_, 0) << "make_torch_checkpoints.py failed:\n"
                                 << read_text(out_ / "log.txt");
  }

  static Graph import(const std::string& file) {
    const fs::path path = out_ / file;
    return file.ends_with(".json") ? import_torch_index(path) : import_torch(path);
  }

  static inline fs::path out_;
  static inline int script_status_ = -1;
  static inline nlohmann::json manifest_;
};

}  // namespace

TEST_F(TorchInterop, ReadsEveryTensorByteExact) {
  ASSERT_GE(manifest_["ok"].size(), 10u);
  for (const auto& c : manifest_["ok"]) {
    const std::string file = c["file"];
    SCOPED_TRACE(file + " (torch " + manifest_["torch_version"].get<std::string>() + ")");
    const Graph g = import(file);
    const std::string ref = read_text(out_ / c["ref"].get<std::string>());
    ASSERT_EQ(g.initializers().size(), c["tensors"].size());
    for (size_t i = 0; i < c["tensors"].size(); ++i) {
      const auto& spec = c["tensors"][i];
      const std::string name = spec["name"];
      EXPECT_EQ(g.initializers()[i].first, name) << "tensor order";
      const Tensor* t = g.find_initializer(name);
      ASSERT_NE(t, nullptr) << name;
      EXPECT_EQ(t->dtype(), kTorchNames.at(spec["dtype"])) << name;
      EXPECT_EQ(t->shape(), spec["shape"].get<Shape>()) << name;
      const auto bytes = t->bytes();
      ASSERT_EQ(bytes.size(), spec["nbytes"].get<size_t>()) << name;
      EXPECT_EQ(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()),
                std::string_view(ref).substr(spec["offset"], spec["nbytes"]))
          << name << " differs from torch's bytes";
      EXPECT_EQ(t->is_mapped(), spec["zero_copy"].get<bool>()) << name;
    }
    for (const auto& alias : c["aliases"]) {
      const Tensor* a = g.find_initializer(alias[0].get<std::string>());
      const Tensor* b = g.find_initializer(alias[1].get<std::string>());
      ASSERT_TRUE(a && b);
      EXPECT_EQ(a->storage(), b->storage()) << alias.dump();
      EXPECT_EQ(b->bytes().data() - a->bytes().data(), alias[2].get<std::ptrdiff_t>())
          << alias.dump();
    }
  }
}

TEST_F(TorchInterop, RefusesLegacyMaliciousAndUnsupportedFiles) {
  ASSERT_GE(manifest_["errors"].size(), 5u);
  for (const auto& e : manifest_["errors"]) {
    const std::string file = e["file"];
    const Failure f = failure_of([&] { import(file); });
    EXPECT_EQ(f.category, kCategories.at(e["category"])) << file << ": " << f.message;
    for (const auto& words : e["contains"]) {
      EXPECT_NE(f.message.find(words.get<std::string>()), std::string::npos)
          << file << ": expected " << words << " in: " << f.message;
    }
  }
  for (const auto& marker : manifest_["must_not_exist"]) {
    EXPECT_FALSE(fs::exists(marker.get<std::string>())) << "a malicious payload ran: " << marker;
  }
}
