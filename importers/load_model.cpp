#include "importers/load_model.h"

#include <utility>

#include "importers/gguf/gguf_model_reader.h"
#include "importers/hf/hf_folder.h"
#include "importers/hf/tied_embeddings.h"
#include "importers/onnx/onnx_importer.h"
#include "importers/quantized_checkpoint/quantized_checkpoint.h"
#include "importers/quantized_checkpoint/trtllm_ckpt_reader.h"
#include "importers/safetensors/safetensors_reader.h"
#include "importers/torch/torch_reader.h"
#include "ir/error.h"

namespace qforge {

namespace {

// A GGUF decoder as a quantized checkpoint: its Q4_0 / Q8_0 Linears as int4 / int8 group 32.
void read_gguf_model(const std::filesystem::path& path, LoadedModel& loaded) {
  gguf::GgufDecoder d = gguf::read_gguf_decoder(path);
  loaded.graph = std::move(d.graph);
  loaded.config_json = std::move(d.config);
  loaded.unfit_linears = std::move(d.unfit);
  const auto unfit = static_cast<int64_t>(loaded.unfit_linears.size());
  if (d.q4_linears + d.q8_linears + unfit == 0) return;  // a float GGUF
  QuantizedCheckpoint q;
  q.quant_method = "gguf";
  if (d.q4_linears > 0) q.schemes.push_back({4, 32, true, d.q4_linears});
  if (d.q8_linears > 0) q.schemes.push_back({8, 32, true, d.q8_linears});
  if (unfit > 0) q.schemes.push_back({4, 32, false, unfit});  // Q4_1, read as float
  const std::pair<const char*, int64_t> types[] = {
      {"Q4_0", d.q4_linears}, {"Q8_0", d.q8_linears}, {"Q4_1", unfit}};
  for (const auto& [type, n] : types) {
    if (n == 0) continue;
    if (!q.format.empty()) q.format.push_back('+');
    q.format.append(type);
  }
  q.ignore = std::move(d.float_linears);
  q.quantized_linears = d.q4_linears + d.q8_linears;
  loaded.quantized = std::move(q);
}

}  // namespace

LoadedModel load_model(const std::filesystem::path& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    fail_io("input '" + path.string() + "' does not exist");
  }
  LoadedModel loaded;
  if (std::filesystem::is_regular_file(path, ec) && gguf::looks_like_gguf(path)) {
    read_gguf_model(path, loaded);
    return loaded;
  }
  loaded.format = sniff_format(path);
  switch (loaded.format) {
    case FileFormat::Onnx: loaded.graph = import_onnx(path); break;
    case FileFormat::Safetensors:
      loaded.graph = import_safetensors(path);
      record_tied_embeddings(path, loaded.graph);
      break;
    case FileFormat::SafetensorsIndex:
      loaded.graph = import_safetensors_index(path);
      record_tied_embeddings(path, loaded.graph);
      break;
    case FileFormat::TorchZip:
    case FileFormat::TorchLegacy: loaded.graph = import_torch(path); break;
    case FileFormat::TorchIndex: loaded.graph = import_torch_index(path); break;
    case FileFormat::HfFolder: {
      if (is_trtllm_ckpt_folder(path)) {  // TensorRT-LLM's rank{r}.safetensors, its own config
        TrtllmCheckpoint ckpt = load_trtllm_ckpt(path);
        loaded.graph = std::move(ckpt.graph);
        loaded.quantized = std::move(ckpt.quantized);
        loaded.hf_config = parse_hf_config(ckpt.hf_config, (path / "config.json").string());
        loaded.config_json = nlohmann::ordered_json::parse(ckpt.hf_config);
        loaded.weights_format = FileFormat::Safetensors;
        break;
      }
      loaded.hf_config = read_hf_config(path);
      const std::filesystem::path weights = hf_weights_file(path);
      loaded.weights_format = sniff_format(weights);
      switch (loaded.weights_format) {
        case FileFormat::Safetensors: loaded.graph = import_safetensors(weights); break;
        case FileFormat::SafetensorsIndex: loaded.graph = import_safetensors_index(weights); break;
        case FileFormat::TorchZip:
        case FileFormat::TorchLegacy: loaded.graph = import_torch(weights); break;
        case FileFormat::TorchIndex: loaded.graph = import_torch_index(weights); break;
        default: fail_invalid("'" + weights.string() + "' is not a safetensors or torch file");
      }
      record_tied_embeddings(weights, loaded.graph);
      // A quantized checkpoint: its packed Linears into qforge's form (one reader per
      // quant_method); a method without a reader loads as the tensors it stores.
      loaded.quantized = read_quantized_folder(path, read_config_json(path), loaded.graph);
      break;
    }
    case FileFormat::Unknown:
      fail_invalid("'" + path.string() +
                   "' is not a model qforge reads (expected ONNX, safetensors, a torch.save "
                   "checkpoint or a PEFT adapter folder)");
    default:
      fail_unsupported("'" + path.string() + "' is a " + std::string(format_name(loaded.format)) +
                       " file, which this command does not read yet");
  }
  return loaded;
}

}  // namespace qforge
