#pragma once
// Calibration kernels: value ranges, histograms of |x| and the threshold searches over them. The
// contract every backend keeps; the device is picked as in kernels/quantize.h (Cpu, Cuda, or
// Auto = CUDA when available). Buffers are host memory.
//
// Results are bit-identical across backends and thread counts: ranges are min/max over a
// total order, histograms are exact integer counts with one shared bin formula, and the
// threshold scores come from kernels/calib_math.h (fixed summation order, our own logarithm),
// so CUDA and CPU pick the same threshold. Sizes or arguments that break a stated
// precondition throw Error(Internal): they are bugs in the caller, not bad input.
#include <cstdint>
#include <span>
#include <vector>

#include "kernels/device.h"
#include "kernels/workspace.h"

namespace qforge {

// Min and max over the values of x that are not NaN, in the order -Inf < ... < -0.0 < +0.0 <
// ... < +Inf; NaNs are counted, not compared. min = max = 0 when no value is a number.
struct ValueRange {
  float min = 0.0f;
  float max = 0.0f;
  uint64_t count = 0;  // values that are not NaN
  uint64_t nan = 0;
};
// Values in pieces, read as if laid end to end (calibration's real rows of a padded batch, where
// they lie: quant/calib/token_mask.h).
using FloatPieces = std::span<const std::span<const float>>;

// `workspace`, when given, keeps the CUDA backend's device buffers (kernels/workspace.h), here
// and in histogram_abs.
ValueRange minmax(std::span<const float> x, Device device, KernelWorkspace* workspace = nullptr);
// The same over several pieces, as one call over them laid end to end would give (calibration's
// real rows of a padded batch, read where they lie: quant/calib/token_mask.h).
ValueRange minmax(FloatPieces pieces, Device device, KernelWorkspace* workspace = nullptr);

// Adds the histogram of |x| to `bins`: bins.size() equal-width bins over [0, range_max], bin
// = min(int(|x| * scale), bins - 1) with scale = histogram_scale(range_max, bins.size()), so
// values beyond range_max (and +-Inf) land in the last bin. NaNs are skipped; returns how many.
// range_max finite and > 0; 1 <= bins.size() <= 2^24.
uint64_t histogram_abs(std::span<const float> x, float range_max, std::span<uint64_t> bins,
                       Device device, KernelWorkspace* workspace = nullptr);
float histogram_scale(float range_max, size_t bins);  // float(bins) / range_max

// histogram_abs with bins 2^exponent wide: bin = min(int(|x| * 2^-exponent), bins - 1), the
// product exact wherever it is 1 or more, so the bins of a wider power of two are sums of whole
// bins of this one (what calibration's one-pass histograms rely on, quant/calib/observer.h).
// -127 <= exponent <= 126 (2^-exponent a normal float); 1 <= bins.size() <= 2^24.
uint64_t histogram_abs_pow2(std::span<const float> x, int exponent, std::span<uint64_t> bins,
                            Device device, KernelWorkspace* workspace = nullptr);
// The same over several pieces, as over them laid end to end.
uint64_t histogram_abs_pow2(FloatPieces pieces, int exponent, std::span<uint64_t> bins,
                            Device device, KernelWorkspace* workspace = nullptr);

// The least exponent e >= -127 with bins * 2^e > amax (amax finite, >= 0): the width of the
// power-of-two bins that hold every |x| <= amax.
int histogram_exponent(float amax, int64_t bins);
// Bins 2^e wide merged into bins 2^(e + widen) wide, in place: bin i's count moves to bin
// i >> widen (exact: the edges nest). widen >= 0.
void widen_pow2_bins(std::span<uint64_t> bins, int widen);

// minmax(pieces) and the histogram of their |x| in one read: each chunk's bins are counted
// while the chunk is still in the core's cache, at the width its task has needed so far, and
// the tasks' counts merge at the widest (widen_pow2_bins). What it gives is what minmax and then
// histogram_abs_pow2 at `exponent` = max(floor_exponent, histogram_exponent(amax,
// bins.size())) give, whatever the thread count: `binned` is false (and `bins` untouched) when
// amax is not finite, and when floor_exponent is kNoExponent and every value that is a number
// is a zero (no width holds them yet); else `bins` (zeros on entry) holds every number's bin.
constexpr int kNoExponent = -1000;
struct RangeHistogram {
  ValueRange range;
  int exponent = kNoExponent;
  bool binned = false;
};
RangeHistogram range_histogram_abs_pow2(FloatPieces pieces, int floor_exponent,
                                        std::span<uint64_t> bins, Device device,
                                        KernelWorkspace* workspace = nullptr);

// A threshold chosen from a histogram of |x| with N bins over [0, range_max]: `kept` bins are
// kept (threshold = range_max * kept / N), `score` is the divergence or error there.
struct ThresholdChoice {
  int64_t kept = 0;
  double score = 0.0;
};

constexpr int kEntropyLevels = 128;  // TensorRT's: 127 magnitudes and zero
constexpr int kInt8QuantMax = 127;

// TensorRT's entropy calibration, as its reference implementation (pytorch-quantization's
// _compute_amax_entropy, kept in ModelOpt) does it. Bin 0 first counts as bin 1 does: it holds
// every value that rounds to zero anyway (a ReLU's zeros, masked softmax probabilities), and
// left alone it outweighs the rest of P, so the search would clip to resolve it. Then for
// each candidate i = quant_levels .. N: P is bins [0, i) with the counts of bins i.. folded
// into bin i - 1; Q merges bins [0, i) (not the outliers) into quant_levels levels, bin j
// going to level j * quant_levels / i, and spreads each level's count evenly over its
// non-empty bins (of the histogram, so the folded bin i - 1 only if it has values of its
// own). Both are normalised, without smoothing, and scored by KL(P || Q): +inf where some
// P_j > 0 has Q_j = 0 (outliers folded onto an empty bin) or no value lies inside. The least
// divergence wins; ties go to the larger i (less clipping). Needs quant_levels <= N <= 4096,
// 1 <= quant_levels <= 1024 and at least one count; if every count is in bin 0, every score
// is +inf and everything is kept.
ThresholdChoice entropy_threshold(std::span<const uint64_t> hist, int quant_levels, Device device);
// KL(P || Q) of every candidate: scores[k] belongs to i = quant_levels + k.
std::vector<double> entropy_scores(std::span<const uint64_t> hist, int quant_levels, Device device);
// entropy_threshold of every histogram in `hists`: the same choices, the CPU's searched in one
// parallel loop rather than one per histogram.
std::vector<ThresholdChoice> entropy_thresholds(std::span<const std::span<const uint64_t>> hists,
                                                int quant_levels, Device device);

// The threshold minimising the expected squared quantization error. Values are taken as
// uniform within their bin; below the threshold t they round to the nearest multiple of
// t / quant_max (symmetric int8: 127), above it they clip to t. Candidates i = quant_max + 1
// .. N bins, so a quantization step is never narrower than a bin. Ties go to the larger i.
// The score is the mean squared error in units of bin width squared. Needs quant_max < N <=
// 4096 and at least one count.
ThresholdChoice mse_threshold(std::span<const uint64_t> hist, int quant_max, Device device);
std::vector<double> mse_scores(std::span<const uint64_t> hist, int quant_max, Device device);
// mse_threshold of every histogram in `hists`: the same choices, those with one bin count found
// together, so that the CPU search reads its per-candidate error table once for all of them
// rather than once per histogram.
std::vector<ThresholdChoice> mse_thresholds(std::span<const std::span<const uint64_t>> hists,
                                            int quant_max, Device device);

// The smallest threshold, in bins (0 .. N, fractional), below which `percentile` percent of
// the counted values lie, interpolating linearly inside the bin where the cumulative count
// reaches it. 0 for an empty histogram. 0 < percentile <= 100. Host only: it is O(N).
double percentile_threshold(std::span<const uint64_t> hist, double percentile);

}  // namespace qforge
