#include <gtest/gtest.h>

#include "exporters/onnx/onnx_exporter.h"
#include "importers/format.h"
#include "tests/unit/exporters/onnx_test_util.h"

using namespace qforge;
using namespace qforge::testing;

namespace {

std::string safetensors_bytes(const std::string& header) {
  std::string bytes(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) bytes[static_cast<size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
  return bytes + header + std::string(8, '\0');
}

FileFormat sniff_bytes(const TempDir& dir, const std::string& name, const std::string& bytes) {
  write_bytes(dir / name, bytes);
  return sniff_format(dir / name);
}

}  // namespace

TEST(Format, SniffsOnnxByContentNotName) {
  TempDir dir;
  export_onnx(make_mlp(), dir / "model.bin");
  EXPECT_EQ(sniff_format(dir / "model.bin"), FileFormat::Onnx);
  // A model whose first field is not ir_version still parses as ONNX.
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.mutable_graph()->set_name("g");
  std::string reordered;
  {
    onnx::ModelProto graph_only;
    *graph_only.mutable_graph() = m.graph();
    onnx::ModelProto version_only;
    version_only.set_ir_version(8);
    reordered = graph_only.SerializeAsString() + version_only.SerializeAsString();
  }
  EXPECT_EQ(sniff_bytes(dir, "reordered.onnx", reordered), FileFormat::Onnx);
}

TEST(Format, SniffsSafetensorsZipAndLegacyTorch) {
  TempDir dir;
  EXPECT_EQ(sniff_bytes(dir, "w", safetensors_bytes("{\"__metadata__\":{}}")),
            FileFormat::Safetensors);
  EXPECT_EQ(sniff_bytes(dir, "w", std::string("PK\x03\x04", 4) + std::string(40, '\0')),
            FileFormat::TorchZip);
  const std::string legacy("\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19\x2e", 15);
  EXPECT_EQ(sniff_bytes(dir, "w", legacy), FileFormat::TorchLegacy);
  // Pickle protocol 2 without torch's magic number is not a legacy checkpoint.
  EXPECT_EQ(sniff_bytes(dir, "w", std::string("\x80\x02}q\x00.", 6)), FileFormat::Unknown);
}

TEST(Format, SafetensorsHeaderLengthMustFitTheFile) {
  TempDir dir;
  std::string bytes = safetensors_bytes("{}");
  bytes[0] = 100;  // claims a 100-byte header in a 18-byte file
  EXPECT_EQ(sniff_bytes(dir, "w", bytes), FileFormat::Unknown);
}

TEST(Format, SniffsIndexFilesByName) {
  TempDir dir;
  EXPECT_EQ(sniff_bytes(dir, "model.safetensors.index.json", "{}"), FileFormat::SafetensorsIndex);
  EXPECT_EQ(sniff_bytes(dir, "pytorch_model.bin.index.json", "{}"), FileFormat::TorchIndex);
  EXPECT_EQ(sniff_bytes(dir, "other.json", "{}"), FileFormat::Unknown);
}

TEST(Format, SniffsPeftAdapterFolder) {
  TempDir dir;
  std::filesystem::create_directories(dir / "adapter");
  EXPECT_EQ(sniff_format(dir / "adapter"), FileFormat::Unknown);
  write_bytes(dir / "adapter" / "adapter_config.json", "{}");
  EXPECT_EQ(sniff_format(dir / "adapter"), FileFormat::PeftAdapter);
}

TEST(Format, SniffsHfModelFolder) {
  TempDir dir;
  std::filesystem::create_directories(dir / "m");
  EXPECT_EQ(sniff_format(dir / "m"), FileFormat::Unknown);
  write_bytes(dir / "m" / "model.safetensors", "x");
  EXPECT_EQ(sniff_format(dir / "m"), FileFormat::HfFolder);  // config.json missing: said on read
  write_bytes(dir / "m" / "config.json", "{}");
  EXPECT_EQ(sniff_format(dir / "m"), FileFormat::HfFolder);
  write_bytes(dir / "m" / "adapter_config.json", "{}");
  EXPECT_EQ(sniff_format(dir / "m"), FileFormat::PeftAdapter);
  EXPECT_EQ(format_name(FileFormat::HfFolder), "hf-folder");
}

TEST(Format, UnknownBytesAndEmptyFiles) {
  TempDir dir;
  EXPECT_EQ(sniff_bytes(dir, "empty", ""), FileFormat::Unknown);
  EXPECT_EQ(sniff_bytes(dir, "text", "hello, this is not a model\n"), FileFormat::Unknown);
  EXPECT_EQ(sniff_bytes(dir, "tag", std::string("\x08\x08", 2)), FileFormat::Unknown);
}

TEST(Format, MissingPathIsIOError) {
  TempDir dir;
  expect_error([&] { sniff_format(dir / "nope.onnx"); }, ErrorCategory::IO, {"nope.onnx"});
}

TEST(Format, NamesEveryFormat) {
  EXPECT_EQ(format_name(FileFormat::Onnx), "onnx");
  EXPECT_EQ(format_name(FileFormat::Safetensors), "safetensors");
  EXPECT_EQ(format_name(FileFormat::SafetensorsIndex), "safetensors-index");
  EXPECT_EQ(format_name(FileFormat::TorchZip), "torch");
  EXPECT_EQ(format_name(FileFormat::TorchLegacy), "torch-legacy");
  EXPECT_EQ(format_name(FileFormat::TorchIndex), "torch-index");
  EXPECT_EQ(format_name(FileFormat::PeftAdapter), "peft-adapter");
  EXPECT_EQ(format_name(FileFormat::Unknown), "unknown");
}
