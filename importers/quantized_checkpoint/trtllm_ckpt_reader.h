#pragma once
// Reads TensorRT-LLM's checkpoint folder (config.json + rank{r}.safetensors, the layout
// exporters/trtllm/trtllm_ckpt_writer.h writes and TensorRT-LLM's Llama converter and ModelOpt's
// TensorRT-LLM export write; ../shared/REFERENCE.md 3.5) back into qforge's weights-only form
// under Hugging Face names, its int4 Linears in the quantized-Linear form
// (ir/quantized_linear.h):
//   - the tp ranks merged as the converter split them: attention.qkv per rank Q_r||K_r||V_r
//     (un-fused into q_proj, k_proj, v_proj by heads, grouped-query aware), mlp.fc -> gate_proj
//     and mlp.gate -> up_proj along the outputs, attention.dense -> o_proj and mlp.proj ->
//     down_proj along the inputs with their group scales; norms and the embedding whole on every
//     rank (identical, or split with use_parallel_embedding);
//   - lm_head's vocabulary padding (zero rows up to a multiple of tp) dropped; for a config that
//     says tie_word_embeddings (or share_embedding_table), the lm_head written out must equal the
//     embedding and is dropped again, the tie recorded;
//   - int4 (quant_algo W4A16_AWQ): .weight int8 [N_r / 2, K_r], two adjacent output rows per
//     byte, and .weights_scaling_factor [N_r, K_r / group_size]; with pre_quant_scale,
//     .prequant_scaling_factor [K_r] folded where exact (modelopt_int4.h), else Unsupported.
// The Hugging Face config.json the checkpoint stands for is synthesized from its config
// (architecture, sizes, heads, head size, activation, norm epsilon, RoPE base and scaling,
// tie_word_embeddings, dtype): what the engine computes with; a trtllm-ckpt folder holds no
// tokenizer, generation config or token ids.
// Unsupported, named: architectures other than Llama/Mistral, pp_size or cp_size > 1, key/value
// heads duplicated over ranks (tp > kv heads), biases, quant_algo W4A16 / W8A16 (per-channel
// weights TensorRT-LLM's converter stores already interleaved for one GPU's mixed GEMM), other
// algorithms, a float checkpoint, a quantized lm_head. InvalidInput naming the file and tensor:
// anything that disagrees with config.json (a missing or extra rank file or tensor, dtypes,
// shapes, group size, ranks that differ where they must be equal, non-zero vocabulary padding).
#include <filesystem>
#include <string>
#include <vector>

#include "importers/quantized_checkpoint/quantized_checkpoint.h"
#include "ir/graph.h"

namespace qforge {

inline constexpr std::string_view kTrtllmCkptMethod = "trtllm-ckpt";

struct TrtllmCheckpoint {
  Graph graph;                    // Hugging Face names
  QuantizedCheckpoint quantized;  // quant_method "trtllm-ckpt", format the quant_algo
  std::string hf_config;          // the Hugging Face config.json text it stands for
  int tp = 1;
};

// A folder whose config.json has TensorRT-LLM's "architecture" (a string, where Hugging Face
// has "architectures") and "mapping", beside rank0.safetensors.
bool is_trtllm_ckpt_folder(const std::filesystem::path& dir);

// `ranks[r]` holds rank{r}.safetensors' tensors; `file` names config.json in messages.
TrtllmCheckpoint read_trtllm_ckpt(const std::string& config_text, const std::string& file,
                                  const std::vector<Graph>& ranks);

// DIR/config.json and DIR/rank0..rank{world_size-1}.safetensors (memory-mapped).
TrtllmCheckpoint load_trtllm_ckpt(const std::filesystem::path& dir);

}  // namespace qforge
