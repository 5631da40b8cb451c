#pragma once
// GPTQ (Frantar et al. 2022, as the reference implementation and AutoGPTQ do it) for W4A16.
//
// Round-to-nearest quantizes each weight on its own; GPTQ quantizes the rows of W[K, N] (input
// channels) one after the other and, after each, moves its rounding error onto the rows not yet
// quantized, weighted by the calibration activations' second moment H = X^T X (K x K, summed
// over every calibration row of the weight's input). It minimises the layer's output error
// || X W - X Q ||^2 = tr((W - Q)^T H (W - Q)) one row at a time:
//   - dead inputs (H_kk == 0) get H_kk = 1 and a zero weight row; then H += 0.01 mean(diag H) I;
//   - U = the upper Cholesky factor of H^-1 (H^-1 = U^T U, LAPACK dpotrf/dpotri);
//   - rows in order k = 0..K-1 (no act-order), in lazy batches of 128 rows: row k is rounded,
//     err = (w_k - q_k) / U_kk, rows j > k of the batch get w_j -= U_kj err, the rows after the
//     batch get the batch's errors at its end (one product); a batch also ends where a block
//     starts that would reach past it, so every block sees all earlier errors (never needed
//     with 128 and the pass's block sizes);
//   - a block's fp16 scales are chosen when its first row comes up, from the current (already
//     error-compensated) weights of the block, by the same rule as round-to-nearest
//     (quantize_int4_blocked with Int4Scale), so the written format is unchanged.
// Weights reading the same activation share one H. Output columns are independent, so they are
// split into fixed tiles and the result does not depend on the thread count; H is accumulated
// batch by batch in data-set order (f32 products through ops::gemm_f32, summed in f64).
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "ir/batch_source.h"
#include "ir/graph.h"
#include "ir/pass.h"
#include "kernels/int4.h"
#include "quant/w4a16/w4a16.h"

namespace qforge {

// H of one activation: channels x channels, summed over `rows` calibration rows.
struct GptqActivation {
  int64_t channels = 0;
  uint64_t rows = 0;
  std::vector<double> h;  // [channels, channels], row-major, symmetric
};

struct GptqCalibration {
  std::map<std::string, GptqActivation> activations;
  int64_t samples = 0;
  std::string dataset_digest;
};

// Streams activations into H. An activation whose last dimension is not its channel count is
// ignored (its weights then fall back to round-to-nearest).
class GptqObserver {
 public:
  explicit GptqObserver(const std::map<std::string, int64_t>& channels);
  void observe(const std::string& name, const Tensor& value);
  [[nodiscard]] const std::map<std::string, GptqActivation>& activations() const { return acts_; }
  std::map<std::string, GptqActivation> take() { return std::move(acts_); }

 private:
  std::map<std::string, GptqActivation> acts_;
};

// Runs `data` through the graph (CPU Executor, `threads`) and accumulates H for the activations
// of `targets`. Reports into `report` ("gptq-calibrate").
GptqCalibration collect_gptq_calibration(const Graph& graph, BatchSource& data,
                                         std::span<const W4A16Target> targets, int threads,
                                         const std::string& mask_input, PassReport& report);

struct GptqOptions {
  int block_size = 128;
  Int4Scale scale = Int4Scale::Mse;  // as the W4A16 pass chooses block scales
  double damp = 0.01;                // lambda = damp * mean(diag(H))
  int64_t lazy_batch = 128;          // rows per lazy batch update
};

// One weight quantized by GPTQ, in the kernels' layout: [K, N] values, [ceil(K / block), N]
// fp16 scales (a weight stored [N, K] is transposed).
struct GptqWeight {
  int64_t axis = 0;
  std::vector<int8_t> q;
  std::vector<uint16_t> scales;
};

// GPTQ on one weight w[K, N] (f32, kernels' layout) with h [K, K]: q [K, N], scales
// [ceil(K / block), N].
void gptq_quantize(std::span<const float> w, int64_t k, int64_t n, std::span<const double> h,
                   const GptqOptions& options, std::span<int8_t> q, std::span<uint16_t> scales);

// tr((W - D)^T H (W - D)) / rows for w, d [K, N] and h [K, K]: the mean squared output error
// per calibration row that replacing W by D causes.
double gptq_output_error(std::span<const float> w, std::span<const float> d, int64_t k, int64_t n,
                         std::span<const double> h, uint64_t rows);

// GPTQ for every target weight whose activation has calibration rows: weight name -> result.
// Weights without one (no rows, shared by several activations) are left out (the pass then
// rounds them to nearest) with a warning. Adds "gptq" rows to report.stats (per weight: the
// output error of RTN and of GPTQ on the calibration data).
std::map<std::string, GptqWeight> apply_gptq(const Graph& graph,
                                             std::span<const W4A16Target> targets,
                                             const GptqCalibration& calib,
                                             const GptqOptions& options, PassReport& report);

}  // namespace qforge
