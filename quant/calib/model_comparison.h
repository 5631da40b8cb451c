#pragma once
// How far a quantized model's outputs and intermediate values are from its float original's on
// the same data: what `qforge compare` prints and an accuracy budget reads. Both models run
// on every batch; each value that both compute (the quantized one as itself or after its
// QuantizeLinear/DequantizeLinear pair) is compared element by element (quant/calib/quant_error.h).
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ir/batch_source.h"
#include "ir/graph.h"
#include "quant/calib/quant_error.h"

namespace qforge {

struct ValueComparison {
  std::string name;
  ErrorSums error;
  // Top-1 agreement, for [N, C] outputs with C >= 2 (graph outputs only).
  int64_t top1_same = 0, top1_total = 0;
  // Top-1 accuracy against the data's integer `labels` extra, where it has one.
  int64_t right_float = 0, right_quant = 0, labelled = 0;

  [[nodiscard]] LayerErrorRow row() const { return {name, error.sqnr_db(), error.cosine()}; }
};

struct ModelComparison {
  int64_t samples = 0;
  std::vector<ValueComparison> outputs;  // the float graph's outputs, in order
  // Intermediate values both models compute (graph outputs excluded), worst first
  // (ranks_worse): non-finite mismatches and all-zero references first, identical values last.
  std::vector<ValueComparison> layers;
};

struct ModelCompareOptions {
  int threads = 0;  // CPU threads for both executors (0 = all cores)
  // The token-mask input ([batch, seq], non-zero = real token): outputs and values laid out
  // [batch, seq, ...] are compared over real positions only (quant/calib/token_mask.h). Empty:
  // every position counts.
  std::string mask_input;
  // Names of the two models in messages ("model.onnx").
  std::string float_name = "the float model";
  std::string quant_name = "the quantized model";
  // Called after every batch with samples done and samples to do.
  std::function<void(int64_t done, int64_t total)> progress;
};

// Runs `data` from its start through both graphs. Throws Error(InvalidInput) when an input or
// output of the float graph is missing from the quantized one or an output differs in shape or
// is not float, Error(Unsupported) for ops the runtime lacks, and the runtime's error prefixed
// with the sample (quant/calib/sample_context.h) for data a model rejects.
ModelComparison compare_models(const Graph& float_graph, const Graph& quant_graph,
                               BatchSource& data, const ModelCompareOptions& options);

}  // namespace qforge
