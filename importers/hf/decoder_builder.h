#pragma once
// The decoder of a Hugging Face model folder as qforge's own graph (ir/decoder_parts.h), built
// from config.json (importers/hf/decoder_config.h) and the folder's tensors: Llama (Llama 3's
// rope_scaling included), Mistral, Qwen2, Qwen3 and Phi-3, the same arithmetic as transformers'
// float modules run in eager attention. Prefill only: a batch of token ids and its attention
// mask in, logits for every position out; no KV cache.
//
// The graph, in ONNX semantics (default-domain opset 17, float32 activations):
//  - prologue: Gather of model.embed_tokens.weight -> hidden_states; the side values every
//    layer reads:
//      attention_bias          f32 [B, 1, T, T]: 0 where query i may attend key j (j <= i and
//                              key j a real token), float lowest elsewhere; a padded query
//                              attends itself, so no softmax row is ever fully masked and pad
//                              rows stay finite (their values are garbage no real token reads)
//      sliding_attention_bias  the same with i - window < j as well; present only when some
//                              layers slide and others do not (when all slide, attention_bias
//                              itself holds the window)
//      rope_cos, rope_sin      f32 [B, 1, T, rotary_dim]: cos / sin of position * inv_freq
//                              (twice, as transformers' cat(freqs, freqs))
//    Positions come from the mask: cumsum(attention_mask) - 1, clamped at 0, so a left-padded
//    row gives its tokens the positions (and logits) they have unpadded.
//  - layer i: RMSNorm, attention (GQA: each kv head serves heads / kv_heads query heads,
//    Qwen3's q/k RMSNorm per head, RoPE in rotate_half form on the first rotary_dim channels,
//    softmax in f32), residual, RMSNorm, SiLU-gated MLP, residual.
//  - epilogue: final RMSNorm and lm_head (the embedding when tied).
//
// Linear form: every Linear y = x W^T + b is
//     Reshape(x [B, T, in] -> [B*T, in]) -> Gemm(A, W, b, transB=1) -> Reshape -> [B, T, out]
// with W the folder's tensor [out, in] under the folder's name (bias likewise): the form the
// W4A16 / AWQ / GPTQ passes find as a weight stored [N, K] (Gemm transB). Linears reading the
// same input share one Reshape. The Gemm node is named after the module
// ("model.layers.0.self_attn.q_proj", "lm_head"). DecoderLinear::input names the 3-D value
// before the Reshape; DecoderLinear::norm the RMSNorm weight multiplied right before it.
// Phi-3's fused qkv_proj and gate_up_proj stay one Gemm each, split afterwards.
//
// RMSNorm(x) = w * (x * 1 / sqrt(mean(x^2, last axis) + eps)): Mul, ReduceMean, Add, Sqrt,
// Reciprocal, Mul, and a last Mul by the weight initializer (the folder's name).
//
// Quantized Linears (a compressed-tensors folder read by load_model: ir/quantized_linear.h's
// i4/i8 weight and scale) are dequantized when the parts are built, to q * scale rounded to the
// scale's dtype as compressed-tensors and transformers compute them; the graph stays float.
//
// Weights: layer(i), prologue() and epilogue() hold their own tensors only; f32 tensors are
// the folder's memory-mapped windows, bf16/f16/f64 ones are converted to f32 copies when the
// part is built (one layer at a time); whole() converts them all.
#include <filesystem>
#include <memory>
#include <string_view>

#include "importers/hf/decoder_config.h"
#include "ir/decoder_parts.h"
#include "ir/graph.h"

namespace qforge {

// Side-value names (DecoderParts::side_values(), in this order; the sliding one only when
// present).
inline constexpr std::string_view kDecoderAttentionBias = "attention_bias";
inline constexpr std::string_view kDecoderSlidingAttentionBias = "sliding_attention_bias";
inline constexpr std::string_view kDecoderRopeCos = "rope_cos";
inline constexpr std::string_view kDecoderRopeSin = "rope_sin";

// The default-domain opset of every part.
inline constexpr int64_t kDecoderOpset = 17;

// Builds the parts from a parsed config and the folder's tensors (a weights-only Graph whose
// initializers carry the folder's names, as load_model reads a folder). The tensors are shared
// (never copied while f32), so `weights` may go away afterwards. Checks every tensor the
// graph reads before returning: InvalidInput naming the tensor when one is missing or has
// another shape, or is not a float tensor. lm_head.weight is read unless config.json ties the
// embeddings; a config.json without tie_word_embeddings ties them when the folder has no
// lm_head.weight.
std::unique_ptr<DecoderParts> build_decoder_parts(const DecoderConfig& config,
                                                  const Graph& weights);

// Reads DIR/config.json and DIR's weights (safetensors, sharded or not, or torch), then builds.
std::unique_ptr<DecoderParts> load_decoder_parts(const std::filesystem::path& dir);

}  // namespace qforge
