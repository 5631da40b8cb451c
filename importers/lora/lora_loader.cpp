// load_lora_adapter: decides between a PEFT folder and a Kohya file, reads the config and the
// weights through the safetensors and torch.save readers.
#include <fstream>
#include <sstream>

#include "importers/lora/lora_adapter.h"
#include "importers/safetensors/safetensors_reader.h"
#include "importers/torch/torch_reader.h"
#include "ir/error.h"

namespace qforge {

namespace {

namespace fs = std::filesystem;

constexpr uintmax_t kMaxConfigBytes = 16u << 20;

std::string read_config(const fs::path& path) {
  std::error_code ec;
  const uintmax_t size = fs::file_size(path, ec);
  if (ec) fail_io("cannot read '" + path.string() + "': " + ec.message());
  if (size > kMaxConfigBytes) {
    fail_invalid("'" + path.string() + "' is " + std::to_string(size) +
                 " bytes; an adapter_config.json is a few KB, is this the right file?");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) fail_io("cannot open '" + path.string() + "'");
  std::ostringstream text;
  text << in.rdbuf();
  if (!in.good() && !in.eof()) fail_io("cannot read '" + path.string() + "'");
  return text.str();
}

Graph read_weights(const fs::path& path) {
  return path.extension() == ".safetensors" ? import_safetensors(path) : import_torch(path);
}

LoraAdapter load_peft_folder(const fs::path& dir) {
  const fs::path config_path = dir / "adapter_config.json";
  if (!fs::is_regular_file(config_path)) {
    fail_io("no adapter_config.json in '" + dir.string() +
            "'; pass a PEFT adapter folder (as written by save_pretrained)");
  }
  const LoraConfig config = parse_lora_config(read_config(config_path), config_path.string());
  fs::path weights_path = dir / "adapter_model.safetensors";
  if (!fs::is_regular_file(weights_path)) weights_path = dir / "adapter_model.bin";
  if (!fs::is_regular_file(weights_path)) {
    fail_io("no adapter_model.safetensors or adapter_model.bin in '" + dir.string() + "'");
  }
  LoraAdapter adapter =
      build_peft_adapter(config, read_weights(weights_path), weights_path.string());
  adapter.source = dir;
  adapter.name = fs::absolute(dir).lexically_normal().filename().string();
  if (adapter.name.empty())
    adapter.name = fs::absolute(dir).lexically_normal().parent_path().filename().string();
  return adapter;
}

}  // namespace

LoraAdapter load_lora_adapter(const fs::path& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) fail_io("adapter '" + path.string() + "' does not exist");
  if (fs::is_directory(path, ec)) return load_peft_folder(path);
  const std::string file = path.filename().string();
  const fs::path dir = path.has_parent_path() ? path.parent_path() : fs::path(".");
  if (file == "adapter_config.json" ||
      (file.starts_with("adapter_model.") && fs::is_regular_file(dir / "adapter_config.json"))) {
    return load_peft_folder(dir);
  }
  if (path.extension() != ".safetensors") {
    fail_invalid(
        "'" + path.string() +
        "' is not a LoRA adapter; pass a PEFT adapter folder or a Kohya .safetensors file");
  }
  const Graph weights = import_safetensors(path);
  if (!is_kohya_weights(weights)) {
    fail_invalid("'" + path.string() +
                 "' has no lora_down/lora_up keys; for a PEFT adapter pass the folder holding "
                 "adapter_config.json beside it");
  }
  LoraAdapter adapter = build_kohya_adapter(weights, path.string());
  adapter.source = path;
  adapter.name = path.stem().string();
  return adapter;
}

}  // namespace qforge
