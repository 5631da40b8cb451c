// load_lora_adapter on files: PEFT folders, Kohya files, and the errors for missing pieces.
#include <gtest/gtest.h>

#include <fstream>

#include "exporters/safetensors/safetensors_writer.h"
#include "importers/lora/lora_adapter.h"
#include "tests/unit/quant/lora/lora_test_util.h"

using namespace qforge;
using namespace qforge::lora_test;
namespace fs = std::filesystem;

namespace {

class LoraLoader : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("qforge_lora_loader_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "adapter");
  }
  void TearDown() override { fs::remove_all(dir_); }

  void write_text(const fs::path& p, const std::string& text) { std::ofstream(p) << text; }
  Graph peft_weights() {
    Graph w;
    w.set_initializer("base_model.model.q.lora_A.weight", random_tensor({2, 4}, 1));
    w.set_initializer("base_model.model.q.lora_B.weight", random_tensor({3, 2}, 2));
    return w;
  }
  fs::path dir_;
};

}  // namespace

TEST_F(LoraLoader, ReadsPeftFolderFromFolderConfigOrWeightsPath) {
  write_text(dir_ / "adapter/adapter_config.json", config_json(2, 4));
  export_safetensors(peft_weights(), dir_ / "adapter/adapter_model.safetensors");
  for (const fs::path& p : {dir_ / "adapter", dir_ / "adapter/adapter_config.json",
                            dir_ / "adapter/adapter_model.safetensors"}) {
    const LoraAdapter a = load_lora_adapter(p);
    EXPECT_EQ(a.format, LoraFormat::Peft);
    EXPECT_EQ(a.name, "adapter") << p;
    ASSERT_EQ(a.modules.size(), 1u);
    EXPECT_DOUBLE_EQ(a.modules[0].scaling, 2.0);
    EXPECT_TRUE(a.modules[0].a.equals(random_tensor({2, 4}, 1)));
  }
}

TEST_F(LoraLoader, ReadsKohyaFile) {
  Graph w;
  w.set_initializer("lora_unet_a_b.lora_down.weight", random_tensor({2, 4}, 1));
  w.set_initializer("lora_unet_a_b.lora_up.weight", random_tensor({3, 2}, 2));
  export_safetensors(w, dir_ / "style.safetensors");
  const LoraAdapter a = load_lora_adapter(dir_ / "style.safetensors");
  EXPECT_EQ(a.format, LoraFormat::Kohya);
  EXPECT_EQ(a.name, "style");
  EXPECT_EQ(a.modules.at(0).name, "lora_unet_a_b");
}

TEST_F(LoraLoader, MissingPiecesAreIoErrorsNamingThePath) {
  expect_error([&] { load_lora_adapter(dir_ / "nope"); }, ErrorCategory::IO,
               {"nope", "does not exist"});
  expect_error([&] { load_lora_adapter(dir_ / "adapter"); }, ErrorCategory::IO,
               {"no adapter_config.json in", "PEFT adapter folder"});
  write_text(dir_ / "adapter/adapter_config.json", config_json(2, 4));
  expect_error([&] { load_lora_adapter(dir_ / "adapter"); }, ErrorCategory::IO,
               {"no adapter_model.safetensors or adapter_model.bin"});
}

TEST_F(LoraLoader, BadConfigAndForeignFilesAreInvalidInput) {
  write_text(dir_ / "adapter/adapter_config.json", "{\"peft_type\": \"LORA\", ");
  export_safetensors(peft_weights(), dir_ / "adapter/adapter_model.safetensors");
  expect_error([&] { load_lora_adapter(dir_ / "adapter"); }, ErrorCategory::InvalidInput,
               {"adapter_config.json: not valid JSON at byte"});
  write_text(dir_ / "adapter/adapter_config.json", config_json(0, 4));
  expect_error([&] { load_lora_adapter(dir_ / "adapter"); }, ErrorCategory::InvalidInput,
               {"r must be a positive integer"});
  export_safetensors(peft_weights(), dir_ / "lonely.safetensors");
  expect_error([&] { load_lora_adapter(dir_ / "lonely.safetensors"); }, ErrorCategory::InvalidInput,
               {"no lora_down/lora_up keys", "adapter_config.json"});
  write_text(dir_ / "notes.txt", "hello");
  expect_error([&] { load_lora_adapter(dir_ / "notes.txt"); }, ErrorCategory::InvalidInput,
               {"is not a LoRA adapter"});
}
