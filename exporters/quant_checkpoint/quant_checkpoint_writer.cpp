#include "exporters/quant_checkpoint/quant_checkpoint_writer.h"

#include <algorithm>

#include "exporters/awq/awq_writer.h"
#include "exporters/compressed_tensors/compressed_tensors_writer.h"
#include "exporters/gptq/gptq_writer.h"
#include "exporters/modelopt/modelopt_writer.h"
#include "exporters/trtllm/trtllm_ckpt_writer.h"
#include "ir/error.h"

namespace qforge {

const std::vector<std::string_view>& quant_checkpoint_formats() {
  static const std::vector<std::string_view> formats = {"compressed-tensors", "gptq", "gptq-v2",
                                                          "awq", "modelopt-hf", "trtllm-ckpt"};
  return formats;
}

bool is_quant_checkpoint_format(std::string_view format) {
  const auto& f = quant_checkpoint_formats();
  return std::find(f.begin(), f.end(), format) != f.end();
}

bool quant_checkpoint_stores_fp16_scales(std::string_view format) {
  return format == "gptq" || format == "gptq-v2" || format == "awq";
}

uint64_t quant_checkpoint_header_bound(const Graph& inputs) {
  // Per output tensor: its name quoted with a suffix of at most 24 characters, then
  // :{"dtype":"BF16","shape":[...],"data_offsets":[a,b]}, with up to 4 dims and numbers of up to
  // 20 digits: under 224 bytes besides the input's name. A name that JSON escapes can pass the
  // bound; the writer then copies the data once more (correct, slower).
  constexpr uint64_t kOutputsPerInput = 5, kPerOutput = 224, kMetadata = 1024;
  uint64_t bound = kMetadata;
  for (const auto& [name, tensor] : inputs.initializers()) {
    bound += kOutputsPerInput * (static_cast<uint64_t>(name.size()) + kPerOutput);
  }
  return bound;
}

bool quant_checkpoint_holds_mixed_schemes(std::string_view format) {
  return format == "compressed-tensors";
}

std::string quant_scheme_text(int bits, int64_t block_size) {
  return "int" + std::to_string(bits) +
         (block_size > 0 ? " group " + std::to_string(block_size) : std::string(" per channel"));
}

std::unique_ptr<QuantCheckpointWriter> make_quant_checkpoint_writer(
    std::string_view format, const std::filesystem::path& out, QuantCheckpointOptions options) {
  if (format == "compressed-tensors") {
    return std::make_unique<CompressedTensorsWriter>(out, std::move(options));
  }
  if (format == "gptq" || format == "gptq-v2") {
    return std::make_unique<GptqWriter>(out, std::move(options), format == "gptq-v2");
  }
  if (format == "awq") return std::make_unique<AwqWriter>(out, std::move(options));
  if (format == "modelopt-hf") return std::make_unique<ModeloptHfWriter>(out, std::move(options));
  if (format == "trtllm-ckpt") return std::make_unique<TrtllmCkptWriter>(out, std::move(options));
  std::string known;
  for (std::string_view f : quant_checkpoint_formats()) {
    known += (known.empty() ? "" : ", ") + std::string(f);
  }
  fail_usage("--format " + std::string(format) +
             " is not a quantized checkpoint layout qforge writes: use one of " + known);
}

}  // namespace qforge
