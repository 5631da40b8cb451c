#pragma once
// Which kind of file a path is, decided from its bytes (and, for folders, their contents).
#include <filesystem>
#include <string_view>

namespace qforge {

enum class FileFormat { Onnx, Safetensors, SafetensorsIndex, TorchZip, TorchLegacy, TorchIndex,
                        PeftAdapter, HfFolder, Unknown };

std::string_view format_name(FileFormat format);
FileFormat sniff_format(const std::filesystem::path& path);

}  // namespace qforge
