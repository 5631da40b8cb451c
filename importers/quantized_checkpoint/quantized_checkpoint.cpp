#include "importers/quantized_checkpoint/quantized_checkpoint.h"

#include <nlohmann/json.hpp>

#include "importers/quantized_checkpoint/compressed_tensors_reader.h"
#include "importers/quantized_checkpoint/gptq_awq_reader.h"
#include "importers/quantized_checkpoint/modelopt_reader.h"
#include "ir/error.h"

namespace qforge {

namespace {

using ReadFn = QuantizedCheckpoint (*)(const std::string& config_text, const std::string& file,
                                       Graph& graph);

struct QuantizedCheckpointReader {
  std::string_view quant_method;
  ReadFn read;
};

// One row per quant_method qforge reads back; a new format's reader adds its row here.
constexpr QuantizedCheckpointReader kQuantizedCheckpointReaders[] = {
    {kCompressedTensorsMethod, &read_compressed_tensors},
    {kGptqMethod, &read_gptq},
    {kAwqMethod, &read_awq},
    {kModeloptMethod, &read_modelopt_folder},
};

const QuantizedCheckpointReader* find_reader(std::string_view quant_method) {
  for (const auto& r : kQuantizedCheckpointReaders) {
    if (r.quant_method == quant_method) return &r;
  }
  return nullptr;
}

}  // namespace

std::optional<std::string> quantization_method(const std::string& config_text,
                                               const std::string& file) {
  const nlohmann::json j = nlohmann::json::parse(config_text, nullptr, false);
  if (j.is_discarded()) fail_invalid("'" + file + "' is not valid JSON");
  if (!j.is_object()) fail_invalid("'" + file + "' is not a JSON object");
  const auto q = j.find("quantization_config");
  if (q == j.end() || q->is_null()) return std::nullopt;
  if (!q->is_object()) {
    fail_invalid("'" + file + "': \"quantization_config\" is " + q->dump() + ", not an object");
  }
  const auto m = q->find("quant_method");
  if (m == q->end() || !m->is_string()) {
    fail_invalid("'" + file + "': quantization_config has no \"quant_method\" string");
  }
  return m->get<std::string>();
}

bool reads_quant_method(std::string_view quant_method) {
  return find_reader(quant_method) != nullptr;
}

QuantizedCheckpoint read_quantized_checkpoint(const std::string& config_text,
                                              const std::string& file, Graph& graph) {
  const std::optional<std::string> method = quantization_method(config_text, file);
  if (!method) fail_internal("read_quantized_checkpoint: '" + file + "' has no quantization");
  const QuantizedCheckpointReader* reader = find_reader(*method);
  if (reader == nullptr) {
    fail_unsupported("'" + file + "': quantization_config.quant_method '" + *method +
                     "' is not read by qforge (it reads compressed-tensors, gptq, awq and "
                     "modelopt)");
  }
  return reader->read(config_text, file, graph);
}

std::optional<QuantizedCheckpoint> read_quantized_folder(const std::filesystem::path& dir,
                                                         const std::string& config_text,
                                                         Graph& graph) {
  const std::string file = (dir / "config.json").string();
  std::optional<std::string> method = quantization_method(config_text, file);
  std::error_code ec;
  // ModelOpt's older exports write hf_quant_config.json only; TensorRT-LLM reads that file.
  if (!method && std::filesystem::is_regular_file(dir / kHfQuantConfigFile, ec)) {
    return read_modelopt_folder(config_text, file, graph);
  }
  if (!method || !reads_quant_method(*method)) return std::nullopt;
  return read_quantized_checkpoint(config_text, file, graph);
}

}  // namespace qforge
