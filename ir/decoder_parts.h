#pragma once
// A decoder-only language model split for layer-wise passes (DESIGN.md: "Layer-wise calibration
// walks that graph one decoder layer at a time"). The model-folder importer builds it from
// config.json, one builder per family (importers/hf/decoder_builder.h); quant/ walks it without
// knowing the family: run the prologue once, then each layer on the previous layer's output.
//
// Every part is an ordinary IR Graph in ONNX semantics. A layer graph's initializers keep the
// names the folder gives its tensors ("model.layers.3.self_attn.q_proj.weight"), so a pass may
// swap one for a quantized-then-dequantized copy before running the layer.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ir/graph.h"

namespace qforge {

// Value names shared by the parts.
inline constexpr std::string_view kDecoderInputIds = "input_ids";            // int64 [B, T]
inline constexpr std::string_view kDecoderAttentionMask = "attention_mask";  // int64 [B, T]: 1 token, 0 pad
inline constexpr std::string_view kDecoderHidden = "hidden_states";          // float32 [B, T, hidden]
inline constexpr std::string_view kDecoderLayerOutput = "layer_output";      // float32 [B, T, hidden]
inline constexpr std::string_view kDecoderLogits = "logits";                 // float32 [B, T, vocab]

// One Linear of a decoder layer, y = x W^T (+ b), W being the folder's tensor [out, in].
struct DecoderLinear {
  std::string weight;  // initializer name in the layer graph, as in the folder
  std::string bias;    // empty when the Linear has none
  std::string input;   // the layer-graph value the Linear reads, float32 [B, T, in]
  // Linears reading the same input share a group ("attn_in" for q/k/v or a fused qkv,
  // "attn_out", "mlp_in" for gate/up or a fused gate_up, "mlp_out"): AWQ searches one scale per
  // group and GPTQ builds one Hessian per group.
  std::string group;
  // The RMSNorm weight applied right before `input` (AWQ folds its input scales into it); empty
  // when the input does not come straight from a norm (o_proj, down_proj).
  std::string norm;
  int64_t out_features = 0;
  int64_t in_features = 0;
  // The Linear (its weight name) whose output rows are this Linear's input channels one to one,
  // up to a factor from another branch: up_proj for down_proj, v_proj for o_proj where each
  // query head has its own value head. AWQ folds this group's input scales into its rows (and
  // bias), as AutoAWQ does. Empty when there is none.
  std::string producer;
  // The Linear's output enters attention scores (q, k, a fused qkv): AWQ's clip search, which
  // measures the Linear's own output error and not the softmax's, leaves it unclipped, as
  // AutoAWQ does.
  bool attention_scores = false;
};

class DecoderParts {
 public:
  DecoderParts() = default;
  virtual ~DecoderParts() = default;
  DecoderParts(const DecoderParts&) = delete;
  DecoderParts& operator=(const DecoderParts&) = delete;

  [[nodiscard]] virtual int64_t num_layers() const = 0;
  // input_ids, attention_mask -> hidden_states, plus the side values (side_values()) that every
  // layer reads beside hidden_states: the additive attention bias, the RoPE tables.
  [[nodiscard]] virtual Graph prologue() const = 0;
  [[nodiscard]] virtual std::vector<std::string> side_values() const = 0;
  // Layer i: inputs hidden_states then side_values() in that order -> layer_output. Its
  // initializers are the layer's tensors (memory-mapped windows or float32 copies of them).
  [[nodiscard]] virtual Graph layer(int64_t i) const = 0;
  // Layer i's Linears, in the order they run.
  [[nodiscard]] virtual std::vector<DecoderLinear> linears(int64_t i) const = 0;
  // hidden_states -> logits: the final norm and lm_head.
  [[nodiscard]] virtual Graph epilogue() const = 0;
  // The whole model in one graph: input_ids, attention_mask -> logits.
  [[nodiscard]] virtual Graph whole() const = 0;
};

}  // namespace qforge
