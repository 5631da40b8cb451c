#pragma once
// Activation-aware weight scaling (AWQ, Lin et al. 2023, as llm-awq does it) for W4A16.
//
// Input channels that carry large activations matter most to a layer's output, yet round-to-
// nearest gives every weight the same relative precision. AWQ scales weight row k (input
// channel k of W[K, N]) up by s_k before quantizing and divides the activation by s_k, so the
// float graph computes the same function while the salient rows get finer int4 steps:
//   X W = (X diag(1/s)) (diag(s) W) ~ (X diag(1/s)) Q(diag(s) W).
// s = mean|x|^alpha (per channel, over the calibration data), normalised by sqrt(max * min);
// alpha is searched on a grid of `grid` points in [0, 1) minimising || X W - X diag(1/s) Q(diag(s)
// W) ||^2 on a fixed-size sample of calibration rows. alpha = 0 is round-to-nearest, so on the
// sample the chosen scales are never worse than RTN.
//
// Weights reading the same activation (Q/K/V after one LayerNorm) share one s, searched jointly
// (the errors add). 1/s is folded into the producer of the activation when that is exact and
// nothing else reads the activation: LayerNormalization (scale and bias), Mul by a constant
// (RMSNorm's weight), MatMul or Gemm with constant weights (their output columns, with Gemm's
// bias). Otherwise a Mul by the constant 1/s is inserted in front of the scaled weights only
// (llm-awq does the same after GELU). Everything here is sequential or runs through kernels
// whose results do not depend on the thread count, and the row sample is drawn by a fixed-seed
// reservoir over the rows in data-set order, so the output is the same for any thread count.
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "ir/batch_source.h"
#include "ir/graph.h"
#include "ir/pass.h"
#include "kernels/device.h"
#include "quant/w4a16/w4a16.h"

namespace qforge {

// What AWQ keeps of one activation (the input of quantized weights): bounded by channels x
// max_rows, whatever the size of the data set.
struct AwqActivation {
  int64_t channels = 0;
  DType dtype = DType::F32;
  uint64_t rows = 0;            // rows (vectors of `channels` values) seen
  std::vector<double> sum_abs;  // [channels]: sum of |x| over the rows
  std::vector<float> sample;    // [sample_rows(), channels]: a reservoir sample of the rows
  [[nodiscard]] int64_t sample_rows() const {
    return channels > 0 ? static_cast<int64_t>(sample.size()) / channels : 0;
  }
  [[nodiscard]] std::vector<float> mean_abs() const;
};

struct AwqCalibration {
  std::map<std::string, AwqActivation> activations;
  int64_t samples = 0;
  std::string dataset_digest;
};

// Streams activations into AwqActivation records. An activation whose last dimension is not its
// channel count is ignored (its weights then fall back to round-to-nearest).
class AwqObserver {
 public:
  // channels: activation name -> K. max_rows: rows kept per activation for the search.
  AwqObserver(const std::map<std::string, int64_t>& channels, int64_t max_rows);
  void observe(const std::string& name, const Tensor& value);
  [[nodiscard]] const std::map<std::string, AwqActivation>& activations() const { return acts_; }
  std::map<std::string, AwqActivation> take() { return std::move(acts_); }

 private:
  struct Reservoir {
    uint64_t state = 0x9e3779b97f4a7c15ULL;  // splitmix64, one per activation, fixed seed
  };
  int64_t max_rows_;
  std::map<std::string, AwqActivation> acts_;
  std::map<std::string, Reservoir> rngs_;
};

struct AwqOptions {
  int block_size = 128;    // as the W4A16 pass will quantize
  int grid = 20;           // alpha in {0, 1/grid, ..., (grid-1)/grid}
  int64_t max_rows = 512;  // calibration rows kept per activation for the search
  // After scaling, search a clipping range per block and output column (AWQ's second step). It
  // changes the float weights (toward what int4 can hold), so the graph is no longer exactly the
  // original in float; off, apply_awq leaves an equivalent graph.
  bool clip = true;
  // The clip search chooses each block's scale itself (AwqClip::scale), among ratio * amax / 7
  // and the signed ratio * amax / 8 that gives the block's extreme the 8th level (q = -8 on its
  // side, as Int4Scale::Mse's negative candidates), and measures every candidate exactly as that
  // scale rounds: q = clamp(round(w / s), -8, 7), w not clamped first. Off: candidates
  // ratio * amax / 7, measured on w clamped to +-ratio * amax (apply_awq then rounds the clamped
  // weight with `scale`). The layer-wise pass (quant/layerwise/) turns it on.
  bool clip_scales = false;
  // Also try AutoAWQ's and llm-compressor's "duo" scales, mean|x|^alpha / mean|w|^(1 - alpha)
  // (|w| relative to its block's amax, averaged over output columns), beside mean|x|^alpha: the
  // search keeps whichever point has the lower error.
  bool duo = false;
  Device device = Device::Auto;
  Int4Scale scale = Int4Scale::Mse;  // as the W4A16 pass will choose block scales
};

// The activations (A inputs of the MatMul/Gemm weights that `targets` quantizes) -> K.
std::map<std::string, int64_t> awq_activation_channels(const Graph& graph,
                                                       std::span<const W4A16Target> targets);

// The activation a target weight multiplies (input 0 of its MatMul, or of a Gemm without
// transA); nullopt for other uses.
std::optional<std::string> awq_activation_of(const Graph& graph, const W4A16Target& target);

// Runs `data` through the graph (CPU Executor, `threads`) and records the activations of
// `targets`. Reports into `report` ("awq-calibrate").
AwqCalibration collect_awq_calibration(const Graph& graph, BatchSource& data,
                                       std::span<const W4A16Target> targets,
                                       const AwqOptions& options, int threads,
                                       const std::string& mask_input, PassReport& report);

// Searches and applies the scales: rewrites the weights of `targets` (in place) and folds or
// inserts 1/s; with options.clip false the graph stays equivalent to the input one (up to float
// rounding), with it the weights are also clipped where that helps int4. Adds "awq" rows to
// report.stats (one per activation: weights, alpha, errors, clipping, how 1/s went in).
void apply_awq(Graph& graph, std::span<const W4A16Target> targets, const AwqCalibration& calib,
               const AwqOptions& options, PassReport& report);

}  // namespace qforge
