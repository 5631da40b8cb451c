#pragma once
// The Llama-style decoder families qforge maps to and from GGUF (convert_hf_to_gguf.py's
// LlamaModel, Qwen2Model, Qwen3Model) and their per-layer tensor names: one table for the GGUF
// writer (cli/gguf_llama_map.h) and the GGUF model reader (importers/gguf/gguf_model_reader.h).
#include <string_view>
#include <vector>

namespace qforge::gguf {

struct DecoderFamily {
  const char* hf_architecture;
  const char* arch;  // general.architecture and the metadata keys' prefix
  bool permute_qk;   // LlamaModel.modify_tensors regroups Q/K rows; Qwen's converters do not
  bool qk_norm;      // per-head Q/K RMSNorm weights (Qwen3)
  bool llama_keys;   // <arch>.vocab_size and <arch>.rope.dimension_count (LlamaModel only)
  const char* model_type;  // config.json's model_type
};

// In the order a GGUF architecture maps back to the first of its Hugging Face names.
inline constexpr DecoderFamily kDecoderFamilies[] = {
    {"LlamaForCausalLM", "llama", true, false, true, "llama"},
    {"MistralForCausalLM", "llama", true, false, true, "mistral"},
    {"Qwen2ForCausalLM", "qwen2", false, false, false, "qwen2"},
    {"Qwen3ForCausalLM", "qwen3", false, true, false, "qwen3"},
};

// The shape a per-layer tensor has, from config.json's figures.
enum class DecoderDim { Hidden, QOut, KvOut, Inter, Vocab, HeadDim };

// One row per per-layer tensor: the Hugging Face suffix after "model.layers.N.", the GGUF name
// after "blk.N.", and the shape config.json implies (outermost first).
struct DecoderLayerTensor {
  const char* hf;
  const char* gguf;
  std::vector<DecoderDim> shape;
  char rope;             // 'q', 'k' or 0: which heads the Q/K permutation uses
  bool qk_norm = false;  // Qwen3's per-head RMSNorm of Q and K: only where the family has it
};

inline const std::vector<DecoderLayerTensor>& decoder_layer_tensors() {
  using D = DecoderDim;
  static const std::vector<DecoderLayerTensor> table = {
      {"input_layernorm.weight", "attn_norm.weight", {D::Hidden}, 0},
      {"self_attn.q_proj.weight", "attn_q.weight", {D::QOut, D::Hidden}, 'q'},
      {"self_attn.q_proj.bias", "attn_q.bias", {D::QOut}, 'q'},
      {"self_attn.k_proj.weight", "attn_k.weight", {D::KvOut, D::Hidden}, 'k'},
      {"self_attn.k_proj.bias", "attn_k.bias", {D::KvOut}, 'k'},
      {"self_attn.v_proj.weight", "attn_v.weight", {D::KvOut, D::Hidden}, 0},
      {"self_attn.v_proj.bias", "attn_v.bias", {D::KvOut}, 0},
      {"self_attn.o_proj.weight", "attn_output.weight", {D::Hidden, D::QOut}, 0},
      {"self_attn.o_proj.bias", "attn_output.bias", {D::Hidden}, 0},
      {"post_attention_layernorm.weight", "ffn_norm.weight", {D::Hidden}, 0},
      {"mlp.gate_proj.weight", "ffn_gate.weight", {D::Inter, D::Hidden}, 0},
      {"mlp.up_proj.weight", "ffn_up.weight", {D::Inter, D::Hidden}, 0},
      {"mlp.down_proj.weight", "ffn_down.weight", {D::Hidden, D::Inter}, 0},
      {"self_attn.q_norm.weight", "attn_q_norm.weight", {D::HeadDim}, 0, true},
      {"self_attn.k_norm.weight", "attn_k_norm.weight", {D::HeadDim}, 0, true},
  };
  return table;
}

}  // namespace qforge::gguf
