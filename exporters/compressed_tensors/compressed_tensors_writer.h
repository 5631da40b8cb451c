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
// `quantization_config` (quant_method compressed-tensors, format pack-quantized, one config
// group targeting Linear, `ignore` listing the Linear modules left float), its tokenizer and
// generation files copied unchanged, the weights sharded as save_pretrained shards them; built
// under a temporary name and renamed into place (exporters/atomic_folder.h). A .safetensors
// output holds the same tensors (a loader needs the folder's config to know the scheme).
//
// Parts: the graph may be given in pieces, one after another (add()), each a weights-only graph
// holding some tensors in that form; each piece's tensors are on disk when add() returns
// (exporters/safetensors/safetensors_stream_writer.h), so a caller can quantize a large model a
// tensor at a time and never hold it whole.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "ir/graph.h"

namespace qforge {

class AtomicFolder;
class SafetensorsStreamWriter;

// i4 or i8 values [N, K] -> int32 [N, ceil(K * bits / 32)] as above (bits 4 or 8).
Tensor pack_quantized_int32(const Tensor& values);

struct CompressedTensorsOptions {
  bool folder = true;  // a model folder; false: one .safetensors file (or shards beside it)
  // Folder: the model folder the weights came from (config.json, tokenizer, generation files).
  std::filesystem::path source_dir;
  uint64_t max_shard_size = 5'000'000'000;  // bytes of tensor data per shard; 0: one file
  bool overwrite = false;                    // folder: replace an existing one
  // Linear modules left float, for the config's `ignore` ("lm_head"): the caller knows the
  // model's modules, the records only what was quantized.
  std::vector<std::string> ignore;
};

class CompressedTensorsWriter {
 public:
  // Checks the target (as write_hf_folder does for a folder) before anything is written.
  CompressedTensorsWriter(const std::filesystem::path& out, CompressedTensorsOptions options);
  ~CompressedTensorsWriter();
  CompressedTensorsWriter(const CompressedTensorsWriter&) = delete;
  CompressedTensorsWriter& operator=(const CompressedTensorsWriter&) = delete;

  // Writes `part`'s initializers. Throws Unsupported for a record of another form (an ONNX
  // graph's DequantizeLinear weights, MatMulNBits) or a scheme that differs from an earlier
  // part's (mixed precision is not written yet), InvalidInput for a quantized tensor whose
  // name does not end in ".weight".
  void add(const Graph& part);
  // config.json and the shard index; the output renamed into place.
  void finish();

  uint64_t bytes_written() const;
  int64_t quantized_linears() const { return quantized_; }

 private:
  std::filesystem::path out_;
  CompressedTensorsOptions options_;
  std::unique_ptr<AtomicFolder> folder_;
  std::unique_ptr<SafetensorsStreamWriter> tensors_;
  std::set<std::pair<int, int64_t>> schemes_;  // (bits, block size; 0 per channel)
  int64_t quantized_ = 0;
};

// The whole graph at once: the writer, one add(), finish().
void write_compressed_tensors(const Graph& weights, const std::filesystem::path& out,
                              const CompressedTensorsOptions& options);

}  // namespace qforge
