#include "importers/format.h"

#include <array>
#include <cstdint>
#include <cstring>
#include <system_error>

#include <onnx/onnx_pb.h>

#include "ir/error.h"
#include "ir/mapped_file.h"

namespace qforge {

namespace {

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// Reads a protobuf varint; returns the number of bytes used, 0 if malformed or cut short.
size_t read_varint(std::span<const uint8_t> b, uint64_t& value) {
  value = 0;
  for (size_t i = 0; i < b.size() && i < 10; ++i) {
    value |= static_cast<uint64_t>(b[i] & 0x7f) << (7 * i);
    if ((b[i] & 0x80) == 0) return i + 1;
  }
  return 0;
}

// Every serializer writes ModelProto fields in field-number order, and ir_version (field 1) is
// required, so an ONNX file starts with tag 0x08, a small varint, and another ModelProto tag.
bool looks_like_onnx_header(std::span<const uint8_t> b) {
  if (b.size() < 3 || b[0] != 0x08) return false;
  uint64_t ir_version = 0;
  const size_t n = read_varint(b.subspan(1), ir_version);
  if (n == 0 || ir_version == 0 || ir_version > 64) return false;
  uint64_t tag = 0;
  if (read_varint(b.subspan(1 + n), tag) == 0) return false;
  const uint64_t field = tag >> 3;
  const uint64_t wire = tag & 7;
  // producer_name..doc_string, graph, opset_import: length-delimited; model_version: varint.
  return (wire == 2 && field >= 2 && field <= 8 && field != 5) || (wire == 0 && field == 5) ||
         (wire == 2 && (field == 14 || field == 20 || field == 25));
}

// Files that do not start the usual way: accept them if they parse as a ModelProto with a
// graph. Bounded so sniffing a large unknown file stays cheap.
bool parses_as_onnx(std::span<const std::byte> bytes) {
  constexpr size_t kMaxParse = 64u << 20;
  if (bytes.empty() || bytes.size() > kMaxParse) return false;
  onnx::ModelProto model;
  return model.ParseFromArray(bytes.data(), static_cast<int>(bytes.size())) && model.has_graph() &&
         model.has_ir_version();
}

bool is_safetensors(std::span<const uint8_t> b, uint64_t file_size) {
  if (b.size() < 9) return false;
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | b[static_cast<size_t>(i)];
  return header_len >= 2 && header_len <= file_size - 8 && b[8] == '{';
}

constexpr std::array<uint8_t, 14> kTorchLegacyMagic = {0x80, 0x02, 0x8a, 0x0a, 0x6c, 0xfc, 0x9c,
                                                       0x46, 0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19};

}  // namespace

std::string_view format_name(FileFormat format) {
  switch (format) {
    case FileFormat::Onnx: return "onnx";
    case FileFormat::Safetensors: return "safetensors";
    case FileFormat::SafetensorsIndex: return "safetensors-index";
    case FileFormat::TorchZip: return "torch";
    case FileFormat::TorchLegacy: return "torch-legacy";
    case FileFormat::TorchIndex: return "torch-index";
    case FileFormat::PeftAdapter: return "peft-adapter";
    case FileFormat::HfFolder: return "hf-folder";
    case FileFormat::Unknown: return "unknown";
  }
  return "unknown";
}

FileFormat sniff_format(const std::filesystem::path& path) {
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (!std::filesystem::exists(status)) fail_io("input '" + path.string() + "' does not exist");
  if (std::filesystem::is_directory(status)) {
    if (std::filesystem::is_regular_file(path / "adapter_config.json", ec)) {
      return FileFormat::PeftAdapter;
    }
    // config.json or the weights save_pretrained writes: a model folder (a missing config.json
    // is reported when it is read, naming it).
    for (const char* name : {"config.json", "model.safetensors", "model.safetensors.index.json",
                             "pytorch_model.bin", "pytorch_model.bin.index.json"}) {
      if (std::filesystem::exists(path / name, ec)) return FileFormat::HfFolder;
    }
    return FileFormat::Unknown;
  }
  const std::string name = path.filename().string();
  if (ends_with(name, ".safetensors.index.json")) return FileFormat::SafetensorsIndex;
  if (ends_with(name, ".bin.index.json")) return FileFormat::TorchIndex;

  const auto file = MappedFile::open(path);
  const auto bytes = file->bytes();
  const std::span<const uint8_t> b(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  if (b.size() >= 4 && std::memcmp(b.data(), "PK\x03\x04", 4) == 0) return FileFormat::TorchZip;
  if (b.size() >= kTorchLegacyMagic.size() &&
      std::memcmp(b.data(), kTorchLegacyMagic.data(), kTorchLegacyMagic.size()) == 0) {
    return FileFormat::TorchLegacy;
  }
  if (is_safetensors(b, b.size())) return FileFormat::Safetensors;
  if (looks_like_onnx_header(b.first(std::min<size_t>(b.size(), 16))) || parses_as_onnx(bytes)) {
    return FileFormat::Onnx;
  }
  return FileFormat::Unknown;
}

}  // namespace qforge
