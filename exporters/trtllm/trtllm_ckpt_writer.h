#pragma once
// TensorRT-LLM's checkpoint for its legacy engine build (`trtllm-build --checkpoint_dir OUT`):
// a folder with config.json and one rank{r}.safetensors per tensor-parallel rank
// (../shared/REFERENCE.md 3.5; TensorRT-LLM tensorrt_llm/models/llama/convert.py,
// models/modeling_utils.py preprocess_perlayer_weights, quantization/layers.py; ModelOpt
// torch/export/quant_utils.py pack_int4_in_uint8).
//
// Names, as TensorRT-LLM's Llama converter writes them:
//   model.embed_tokens          -> transformer.vocab_embedding.weight (whole on every rank)
//   layers.N.input_layernorm    -> transformer.layers.N.input_layernorm.weight
//   layers.N.self_attn.q|k|v    -> transformer.layers.N.attention.qkv (rank r: Q_r||K_r||V_r)
//   layers.N.self_attn.o_proj   -> transformer.layers.N.attention.dense  (split along K)
//   layers.N.post_attention_layernorm -> transformer.layers.N.post_layernorm.weight
//   layers.N.mlp.gate_proj      -> transformer.layers.N.mlp.fc    (split along N)
//   layers.N.mlp.up_proj        -> transformer.layers.N.mlp.gate  (split along N)
//   layers.N.mlp.down_proj      -> transformer.layers.N.mlp.proj  (split along K)
//   model.norm                  -> transformer.ln_f.weight
//   lm_head (the embedding when tied) -> lm_head.weight, zero-padded to a multiple of tp rows,
//                                  split along N
// A group-wise int4 Linear [N, K] is written as ModelOpt's TensorRT-LLM export writes it:
//   .weight                  int8 [N/2, K]: byte (i, k) = q[2i, k] & 0xF | q[2i+1, k] << 4
//   .weights_scaling_factor  [N, K/g] in the scale's dtype
// with qforge's own integers and scales (value = q * scale; ModelOpt's amax/7 is only how it
// chooses its scale, the engine reads q * s). trtllm-build turns these into its GPU's mixed-GEMM
// layout itself (preprocess_weights_for_mixed_gemm, for W4A16_AWQ/W4A8_AWQ only), so the files
// do not depend on the GPU. config.json says quant_algo W4A16_AWQ: in TensorRT-LLM, W4A16 and
// W8A16 are per-channel schemes whose int8 checkpoint tensors must already be in that
// GPU-specific layout (or be float and requantized by the engine build), so qforge writes
// group-wise int4 only, under the one algorithm whose checkpoint is portable, with
// pre_quant_scale false (qforge's AWQ folds its scales into the norms and producers); INT8
// per-channel weights are refused, naming why.
//
// Parts arrive one tensor at a time (exporters/quant_checkpoint/quant_checkpoint_writer.h):
// q, k and v of a layer are held until all three have come (one layer when the checkpoint is in
// layer order), every other tensor is written when it arrives. Output built under a temporary
// name and renamed into place (exporters/atomic_folder.h).
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "exporters/quant_checkpoint/quant_checkpoint_writer.h"

namespace qforge {

class AtomicFolder;
class SafetensorsStreamWriter;

// int4 values [N, K] (ONNX packing) -> int8 [N/2, K] as above. Throws Internal for odd N.
Tensor pack_int4_adjacent_rows(const Tensor& values);

// What the writer's constructor checks (a folder output, the source folder's config.json, a
// Llama/Mistral architecture, a --tp that divides the heads), and the scheme (int4 in groups of
// 64 or 128): for the caller to refuse before anything is quantized. Usage or Unsupported.
void check_trtllm_ckpt(const QuantCheckpointOptions& options, int bits, int64_t block_size);

class TrtllmCkptWriter : public QuantCheckpointWriter {
 public:
  // Reads options.source_dir's config.json and checks the model and --tp before anything is
  // written: Usage for a non-folder output, a missing source folder, tp that does not divide the
  // heads; Unsupported for an architecture other than Llama/Mistral.
  TrtllmCkptWriter(const std::filesystem::path& out, QuantCheckpointOptions options);
  ~TrtllmCkptWriter() override;
  TrtllmCkptWriter(const TrtllmCkptWriter&) = delete;
  TrtllmCkptWriter& operator=(const TrtllmCkptWriter&) = delete;

  void add(const Graph& part) override;
  void finish() override;
  uint64_t bytes_written() const override;
  int64_t quantized_linears() const override { return quantized_; }

 private:
  // One HF Linear as it arrived: float weight, or integers and scale.
  struct Linear {
    std::string source;  // "model.layers.0.self_attn.q_proj.weight"
    Tensor weight;       // float [N, K], or i4/i8 values [N, K]
    Tensor scale;        // quantized: [N, K / block]
    bool quantized = false;
    int bits = 0;
    int64_t block = 0;
  };
  void add_tensor(const std::string& name, const Tensor& tensor, const Linear* linear);
  void write_linear(const std::string& module, const std::vector<const Linear*>& parts,
                    bool row_parallel);
  void write_lm_head(const Tensor& weight, const std::string& from);
  void write_all(const std::string& name, const Tensor& tensor);
  void note_float_dtype(const Tensor& tensor);

  std::filesystem::path out_;
  QuantCheckpointOptions options_;
  nlohmann::ordered_json source_config_;
  std::string architecture_;
  int tp_ = 1;
  int64_t heads_ = 0, kv_heads_ = 0, head_size_ = 0;
  bool tied_ = false;
  std::unique_ptr<AtomicFolder> folder_;
  std::vector<std::unique_ptr<SafetensorsStreamWriter>> ranks_;
  std::map<int64_t, std::map<char, Linear>> pending_qkv_;  // layer -> 'q' | 'k' | 'v'
  std::optional<std::pair<int, int64_t>> scheme_;          // (bits, block) of every quantized
  std::vector<std::string> exclude_;                      // TensorRT-LLM modules left float
  std::optional<DType> dtype_;
  bool lm_head_written_ = false;
  int64_t quantized_ = 0;
};

}  // namespace qforge
