#pragma once
// Writes weights in compressed-tensors' `pack-quantized` layout, the one vLLM and transformers
// load (../shared/REFERENCE.md 3.1; compressed_tensors/compressors/pack_quantized): each
// quantized Linear of a weights-only graph (ir/quantized_linear.h: a weight record without a
// reader, i4 or i8 [N, K] and its scale) becomes
//   <module>.weight_packed  int32 [N, ceil(K * bits / 32)]: q + 2^(bits - 1) as unsigned, 32 / bits
//                           values per word along K, element j of a word at bits j * bits
//   <module>.weight_scale   [N, K / group] (blocked) or [N, 1] (per channel), the scale's dtype
//   <module>.weight_shape   int64 [2] = (N, K)
// with no zero point (symmetric); every other initializer is written as it is. What is quantized
// comes from the records alone, never from tensor names: a later pass (AWQ, GPTQ) that writes
// the same form is exported the same way.
//
// A folder output is a Hugging Face model folder: the source folder's config.json with a
// `quantization_config` (compressed_tensors_config below: one config group targeting Linear,
// or one per scheme with regex targets for a mixed-precision model; `ignore` listing the Linear
// modules left float), its tokenizer and
// generation files copied unchanged, the weights sharded as save_pretrained shards them; built
// under a temporary name and renamed into place (exporters/atomic_folder.h). A .safetensors
// output holds the same tensors (a loader needs the folder's config to know the scheme).
//
// Parts: the graph may be given in pieces (exporters/quant_checkpoint/quant_checkpoint_writer.h).
#include <filesystem>
#include <memory>

#include "exporters/quant_checkpoint/hf_quant_writer.h"

namespace qforge {

// compressed-tensors `targets` that match exactly `modules` (as compressed-tensors' match_name
// matches "re:" targets: Python's re.match, from the name's start): one anchored regex per
// name pattern, the layer numbers of "prefix.<N>.suffix" names as an alternation, e.g.
// "re:^model\.layers\.(?:0|3)\.mlp\.down_proj$" (JSON doubles the backslashes). Sorted,
// whatever the order of `modules`.
std::vector<std::string> module_targets(const std::vector<std::string>& modules);

// config.json's quantization_config for the modules of each (bits, block size; 0 per channel)
// scheme: one scheme is one group targeting "Linear" and format pack-quantized; several are one
// group each (in scheme order), targeting exactly its modules, with the top-level format
// "mixed-precision" (each group's own format pack-quantized). `ignore`: the Linears left float.
nlohmann::ordered_json compressed_tensors_config(
    const std::map<std::pair<int, int64_t>, std::vector<std::string>>& schemes,
    const std::vector<std::string>& ignore);

// i4 or i8 values [N, K] -> int32 [N, ceil(K * bits / 32)] as above (bits 4 or 8).
Tensor pack_quantized_int32(const Tensor& values);

// The layout above, for HfQuantWriter (exporters/quant_checkpoint/hf_quant_writer.h).
std::unique_ptr<HfQuantLayout> make_compressed_tensors_layout();

using CompressedTensorsOptions = QuantCheckpointOptions;

class CompressedTensorsWriter : public HfQuantWriter {
 public:
  // Checks the target (as write_hf_folder does for a folder) before anything is written.
  CompressedTensorsWriter(const std::filesystem::path& out, CompressedTensorsOptions options)
      : HfQuantWriter(make_compressed_tensors_layout(), out, std::move(options)) {}
};

// The whole graph at once: the writer, one add(), finish().
void write_compressed_tensors(const Graph& weights, const std::filesystem::path& out,
                              const CompressedTensorsOptions& options);

}  // namespace qforge
