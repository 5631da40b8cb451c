#pragma once
// One interface for every serving layout of a weights-only quantized checkpoint
// (compressed-tensors, GPTQ, AWQ, ModelOpt's Hugging Face export, TensorRT-LLM's checkpoint):
// the caller hands the model over in parts, one after another (add()), each a weights-only graph
// whose quantized Linears are in the form of ir/quantized_linear.h (a weight record without a
// reader, i4 or i8 [N, K] and its scale); the writer turns each part into its layout's tensors and
// has them on disk when add() returns, so a large model is never held whole. finish() writes the
// configuration and renames the output into place; an exception before then leaves nothing.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <optional>

#include <nlohmann/json.hpp>

#include "ir/graph.h"

namespace qforge {

struct QuantCheckpointOptions {
  bool folder = true;  // a model folder; false: one .safetensors file (or shards beside it)
  // Folder: the model folder the weights came from (config.json, tokenizer, generation files).
  std::filesystem::path source_dir;
  // Folder: config.json to write instead of source_dir's, for an input that has no Hugging Face
  // one (a GGUF file's, synthesized from its metadata; a TensorRT-LLM checkpoint's, from its own
  // config); source_dir's other files are still copied when it is given.
  std::optional<nlohmann::ordered_json> config;
  uint64_t max_shard_size = 5'000'000'000;  // bytes of tensor data per shard; 0: one file
  bool overwrite = false;                    // folder: replace an existing one
  // Linear modules left float, for the configuration ("lm_head"): the caller knows the model's
  // modules, the records only what was quantized.
  std::vector<std::string> ignore;
  int tensor_parallel = 1;  // layouts split per rank (trtllm-ckpt): how many ranks
  // An upper bound on each safetensors file's header, in bytes (0: unknown): the data is then
  // written once, after room for the header (safetensors_stream_writer.h). The caller sizes it
  // from the input's tensors: quant_checkpoint_header_bound.
  uint64_t header_reserve = 0;
};

// A bound on the header of any file a quantized checkpoint writer makes from `inputs`' tensors:
// every layout writes at most 5 tensors per input tensor (and a tied lm_head), each named
// as its input plus a suffix of at most 24 characters, with a dtype, a shape of at most 4 dims
// and two offsets; plus the metadata.
uint64_t quant_checkpoint_header_bound(const Graph& inputs);

class QuantCheckpointWriter {
 public:
  virtual ~QuantCheckpointWriter() = default;
  // Writes `part`'s tensors. Throws Unsupported for a record the layout cannot hold, naming it.
  virtual void add(const Graph& part) = 0;
  // The configuration and index files; the output renamed into place.
  virtual void finish() = 0;
  virtual uint64_t bytes_written() const = 0;
  virtual int64_t quantized_linears() const = 0;
};

// The layouts `--format` names for a weights-only quantized checkpoint; the first is the default.
const std::vector<std::string_view>& quant_checkpoint_formats();
bool is_quant_checkpoint_format(std::string_view format);
// True for the layouts that store fp16 scales whatever the model dtype (gptq, gptq-v2, awq): a
// quantizer writing them chooses scales fp16 holds, and a scale it does not hold is refused.
bool quant_checkpoint_stores_fp16_scales(std::string_view format);
// True for the layouts that hold Linears of several schemes (bits, block size) in one checkpoint
// (compressed-tensors: one config group per scheme). The others refuse a mixed model.
bool quant_checkpoint_holds_mixed_schemes(std::string_view format);
// "int4 group 32", "int8 per channel": a scheme as messages name it.
std::string quant_scheme_text(int bits, int64_t block_size);

// The writer for `format` (one of quant_checkpoint_formats()); checks the target before anything
// is written. Throws Usage for a format that does not write a `.safetensors` file when
// !options.folder.
std::unique_ptr<QuantCheckpointWriter> make_quant_checkpoint_writer(
    std::string_view format, const std::filesystem::path& out, QuantCheckpointOptions options);

}  // namespace qforge
