#pragma once
// Static calibration: runs a data set through the model and finds, for every float activation,
// the range the static INT8 QDQ pass turns into a scale (scale = amax / 127).
//
// Activations are the float values that depend on the data: the graph inputs fed from the data
// set and every node output downstream of them. Initializers, constants and what is computed
// from them alone are skipped. One pass over the data set finds min, max and amax per tensor
// and (not for minmax) fills a histogram of |x| with power-of-two bins that widen as larger
// values arrive (quant/calib/observer.h). Results do not depend on sample order, nor on batch
// size beyond the products' rounding and, with a token mask, the padded positions of values
// observed whole (each batch runs only as long as its longest sequence: token_mask.h), and
// memory is bounded by tensors x bins, whatever the number of samples (the samples stream,
// see ir/batch_source.h).
//
// The default method is entropy, TensorRT's KL search floored at the least-squared-error
// threshold (entropy_kept): it clips rare outliers, which on activations usually buys more
// resolution than it costs, but not whole outlier channels (ONNX Runtime defaults to minmax,
// which never clips).
#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "ir/batch_source.h"
#include "ir/graph.h"
#include "ir/pass.h"
#include "kernels/device.h"
#include "ir/calib_methods.h"
#include "ir/calibration_table.h"
#include "runtime/executor.h"

namespace qforge {

struct CalibOptions {
  CalibMethod method = CalibMethod::Entropy;
  double percentile = 99.99;  // percentile method: (0, 100]
  int num_bins = 2048;        // histogram bins per tensor: 128 .. 4096
  Device device = Device::Auto;
  int threads = 0;  // CPU threads for the Executor and kernels (0 = all cores)
  // The graph input holding the token mask ([batch, seq], non-zero = real token): observers see
  // only the real positions of activations laid out [batch, seq, ...] (token_mask.h). Empty: no
  // mask (resolve_mask_input picks it from --calib-mask).
  std::string mask_input;
  // Count the histograms for minmax too (it needs none itself): for a report that shows the
  // threshold every method would choose. Other methods always keep theirs in the table.
  bool histograms_for_minmax = false;
  // Observe only these values: what a consumer reads, such as a static INT8 conversion's range
  // needs (quant/static/static_int8_plan.h); the nodes none of them needs do not run. None:
  // every activation. A value's range does not depend on which others are observed.
  std::optional<std::set<std::string>> only;
  // Called after every batch with samples done and samples to do.
  std::function<void(int64_t done, int64_t total)> progress;
};

// Throws Error(Usage) for options out of range, Error(Unsupported) for a graph the Executor
// cannot run, and Error(InvalidInput) for an activation holding +-Inf (naming the tensor) or
// data the model rejects (the message names the sample: quant/calib/sample_context.h). NaNs
// that arise inside the model are left out of every statistic and reported as warnings.
CalibrationTable calibrate(const Graph& graph, BatchSource& data, const CalibOptions& options,
                           PassReport& report);

// The graph inputs to feed: those that are not also initializers, in graph order.
std::vector<ValueInfo> calibration_inputs(const Graph& graph);

// Runs every batch of `data`, from its start, through `executor`, handing each computed value
// to `observe`; where `mask_input` names the batch's token mask, values laid out [batch, seq,
// ...] arrive with only their real positions ([real, ...], token_mask.h). `after_batch` (may be
// empty) gets each batch's sample count. Returns the number of batches.
int64_t stream_batches(Executor& executor, BatchSource& data, const std::string& mask_input,
                       ValueObserver observe, const std::function<void(int64_t)>& after_batch);

class TokenMask;  // quant/calib/token_mask.h

// The same, handing each value with its batch's token mask where the mask covers the value and
// the batch has padded positions (null otherwise): the observer leaves those positions out
// itself (TokenMask::real_spans reads the real rows where they lie, without a copy).
using MaskedValueObserver =
    std::function<void(const std::string& name, const Tensor& value, const TokenMask* padded)>;
int64_t stream_batches(Executor& executor, BatchSource& data, const std::string& mask_input,
                       MaskedValueObserver observe,
                       const std::function<void(int64_t)>& after_batch);

// stream_batches through a CPU executor of `graph` with `threads`: the streaming run under
// AWQ's and GPTQ's calibration.
int64_t observe_dataset(const Graph& graph, BatchSource& data, int threads,
                        const std::string& mask_input, ValueObserver observe);

// AWQ's and GPTQ's calibration record: `observer` (observe(name, value), take()) run over
// `data`, padded positions left out where `mask_input` names the token mask; fills the Calibration's activations, samples and dataset digest, and the report's
// "samples", "dataset_digest", "activations" (how many were seen) and seconds.
template <class Calibration, class Observer>
Calibration collect_activations(const Graph& graph, BatchSource& data, int threads,
                                const std::string& mask_input, Observer& observer,
                                PassReport& report) {
  const auto start = std::chrono::steady_clock::now();
  observe_dataset(graph, data, threads, mask_input,
                  [&observer](const std::string& name, const Tensor& value) {
                    observer.observe(name, value);
                  });
  Calibration calib;
  calib.samples = data.size();
  calib.dataset_digest = data.digest();
  calib.activations = observer.take();
  int64_t seen = 0;
  for (const auto& [name, a] : calib.activations) seen += a.rows > 0 ? 1 : 0;
  report.stats["samples"] = calib.samples;
  report.stats["dataset_digest"] = calib.dataset_digest;
  report.stats["activations"] = seen;
  report.stats["mask"] =
      mask_input.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(mask_input);
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return calib;
}

// The threshold `method` chooses on `hist`, a histogram of |x| over [0, range] whose largest
// value was `amax` (<= range): what calibrate() puts in the table (minmax: `amax`; the others at
// most `amax`), and the fraction of the counted values above it.
struct MethodThreshold {
  float amax = 0.0f;
  double clipped = 0.0;
};
MethodThreshold choose_threshold(CalibMethod method, std::span<const uint64_t> hist, double range,
                                 float amax, double percentile, Device device);
// choose_threshold of each histogram, the searches of all of them together (kernels/calib.h,
// mse_thresholds): the same thresholds, faster for many tensors.
std::vector<MethodThreshold> choose_thresholds(CalibMethod method,
                                               std::span<const std::span<const uint64_t>> hists,
                                               std::span<const double> ranges,
                                               std::span<const float> amax, double percentile,
                                               Device device);

// The entropy method's threshold, in bins of the histogram of |x| (at least 128 bins): TensorRT's
// least-KL threshold (kernels/calib.h, 128 levels), floored at the least-squared-error one.
int64_t entropy_kept(std::span<const uint64_t> hist, Device device);

}  // namespace qforge
