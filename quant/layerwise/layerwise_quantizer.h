#pragma once
// Layer-by-layer weight quantization of a decoder-only language model in bounded memory
// (ir/decoder_parts.h). The calibration set (token ids, ir/batch_source.h: input_ids and
// attention_mask int64 [b, T]) runs through the prologue once; its hidden states and side values
// (float32, per batch) stay in memory. Then, for each decoder layer in turn:
//  1. the float layer runs over every batch; each Linear group's input is observed at the real
//     tokens only (quant/calib/token_mask.h): a row sample (AWQ's search, the error proxies),
//     and H = X^T X for GPTQ; the float outputs of the first `error_samples` samples are kept;
//  2. every Linear of the layer is quantized: W4A16 (round to nearest, AWQ or GPTQ, blocks of
//     32/64/128 along `in`) or INT8 weight-only per output channel, by the cores the whole-graph
//     passes use (kernels/int4.h, quant/w4a16/awq_search.h, quant/w4a16/gptq.h), and written
//     into `weights` in the form of ir/quantized_linear.h (scales in the weight's float dtype);
//  3. the layer graph's weights are swapped for the dequantized ones (q * scale as stored) and
//     the layer runs again: its outputs replace the hidden states and feed the next layer (as
//     GPTQ does), and give the layer-output error against the float layer on the same inputs.
// Only one layer graph (whose tensors are windows of the memory-mapped files) and the hidden
// states are resident; the prologue's and layers' graphs are built on demand.
//
// AWQ: a group whose input comes straight from a norm (DecoderLinear::norm: q/k/v and
// gate/up) gets llm-awq's scale search; 1/s is folded into that norm's weight, which is written
// back into `weights` (and the layer graph) under its name. A group whose input channels are
// another Linear's output rows (DecoderLinear::producer: down_proj after up_proj, o_proj after
// v_proj without grouped-query attention) gets the same search with 1/s folded into those rows,
// as AutoAWQ does. Then every weight but q/k (DecoderLinear::attention_scores) gets the clip
// search. With the amax rule (AWQ's default `scale`) the clip search chooses each block's scale
// itself, among ratio * amax / 7 and the signed ratio * amax / 8 (AwqOptions::clip_scales), by
// the block's share of the output error on the sample measured exactly as that scale rounds,
// and the weight is rounded with it; with `scale` mse the weight is clamped to the clip limits
// as apply_awq clamps it and rounded by the mse rule. q/k are rounded by `scale`.
//
// Results do not depend on the thread count: the Executor, the int4 kernels and the searches
// are deterministic, the row samples are fixed-seed reservoirs over the rows in data-set order.
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ir/batch_source.h"
#include "ir/decoder_parts.h"
#include "ir/graph.h"
#include "kernels/device.h"
#include "kernels/int4.h"
#include "quant/w4a16/w4a16.h"

#include <nlohmann/json.hpp>

namespace qforge {

enum class LayerwiseScheme { W4A16, Int8PerChannel };

std::string_view layerwise_scheme_name(LayerwiseScheme scheme);  // "w4a16", "int8-weights"

struct LayerwiseOptions {
  LayerwiseScheme scheme = LayerwiseScheme::W4A16;
  W4Method method = W4Method::Rtn;  // W4A16: rtn, awq, gptq
  int block_size = 128;             // W4A16: 32, 64 or 128 (in_features must be a multiple)
  std::optional<Int4Scale> scale;   // unset: default_int4_scale(method)
  int awq_grid = 20;                // alpha points
  bool awq_clip = true;             // AWQ's clip search
  bool awq_duo = true;              // AWQ also tries mean|x|^a / mean|w|^(1-a) (AwqOptions::duo)
  double gptq_damp = 0.01;          // lambda = damp * mean(diag(H))
  // Input rows kept per Linear group (a fixed-seed reservoir over the real tokens): AWQ's
  // searches and the per-Linear error proxies run on them.
  int64_t sample_rows = 512;
  // Samples (the first ones) whose float layer outputs are kept to measure the layer-output
  // error; 0: every sample (memory: one more copy of their hidden states).
  int64_t error_samples = 16;
  int threads = 0;                // CPU threads for the Executor and kernels (0: all cores)
  Device device = Device::Auto;   // the int4 kernels of the AWQ search (same bits on any)
  // int8 scales on fp16's grid as well as in the weight's dtype (LinearWeightQuantOptions).
  bool fp16_scales = false;
  // Mixed precision: bits of a Linear weight by name (4: int4 in blocks of `block_size` by
  // `method`; 8: INT8 per output channel, round to nearest; 0: left float, untouched); a weight
  // not listed gets the scheme's. AWQ's scale search runs on a group only when all its members
  // and the producer it folds into (down_proj's up_proj, o_proj's v_proj) are int4; otherwise
  // the group's int4 members are rounded to nearest with the block scale rule. GPTQ runs on the
  // int4 members only.
  std::map<std::string, int> bits;
};

struct LinearResult {
  std::string weight;
  std::string group;
  int64_t out_features = 0;
  int64_t in_features = 0;
  // ||X W^T - X Wq^T|| / ||X W^T|| over the group's sampled input rows X (the float layer's
  // inputs), Wq the weight as the quantized model computes with it (AWQ: with 1/s folded back).
  double output_error = 0.0;
  double alpha = 0.0;          // AWQ: the chosen alpha (0 also where no scale applies)
  int64_t clipped = 0;         // AWQ: block columns clipped
};

struct LayerResult {
  int64_t index = 0;
  double seconds = 0.0;           // the whole layer
  double observe_seconds = 0.0;   // float run over the data
  double quantize_seconds = 0.0;  // searches and quantization
  double forward_seconds = 0.0;   // quantized run
  // ||y_q - y|| / ||y|| of the layer output at the real tokens of the first error_samples
  // samples, y the float layer and y_q the quantized one on the same inputs.
  double output_error = 0.0;
  int64_t error_tokens = 0;  // real tokens that error was measured on
  std::vector<LinearResult> linears;
  std::vector<std::string> folded_norms;  // AWQ: norm weights rewritten in `weights`
};

struct LayerwiseResult {
  std::string scheme;  // "w4a16", "int8-weights"
  std::string method;  // "rtn", "awq", "gptq" ("rtn" for int8)
  int block_size = 0;  // 0 for int8
  std::string scale;   // int4 block scale rule ("mse", "amax"), "" for int8
  int64_t samples = 0;
  int64_t tokens = 0;  // real tokens (attention_mask 1) per pass
  int64_t seq_len = 0;
  std::string dataset_digest;
  double prologue_seconds = 0.0;
  double seconds = 0.0;
  std::vector<LayerResult> layers;
};

// Called after the prologue and after each layer, from the calling thread.
class LayerProgress {
 public:
  virtual ~LayerProgress() = default;
  virtual void prologue_done(int64_t samples, int64_t tokens, double seconds) {
    (void)samples, (void)tokens, (void)seconds;
  }
  virtual void layer_done(const LayerResult& layer, int64_t num_layers) = 0;
};

// Runs the whole pass. `weights` is the model folder's weights-only graph: each quantized
// Linear's tensor becomes i4/i8 [out, in] with its scale and record (store_quantized_linear);
// AWQ rewrites folded norm weights. `ids` serves input_ids and attention_mask int64 [b, T].
// Throws Error(Usage) for bad options (a block size that does not divide a Linear's in), and
// Error(InvalidInput) for data the model refuses or a weight holding NaN or Inf (naming it).
LayerwiseResult quantize_layerwise(const DecoderParts& parts, Graph& weights, BatchSource& ids,
                                   const LayerwiseOptions& options,
                                   LayerProgress* progress = nullptr);

// The --json form: figures as ir/json_number.h writes them.
nlohmann::ordered_json layerwise_result_json(const LayerwiseResult& result);

// One line per layer for a terminal: "layer 3/32  1.84 s  output error 0.0123  (worst
// model.layers.3.mlp.down_proj.weight 0.0311)".
std::string layerwise_progress_line(const LayerResult& layer, int64_t num_layers);

}  // namespace qforge
