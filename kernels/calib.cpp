// Backend dispatch and argument checks for kernels/calib.h. Backends trust what arrives here.
#include "kernels/calib.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "ir/error.h"
#include "kernels/calib_math.h"
#include "kernels/cpu/calib_cpu.h"
#ifdef QFORGE_HAVE_CUDA
#include "kernels/cuda/calib_cuda.h"
#endif

namespace qforge {

namespace {

uint64_t checked_total(const char* fn, std::span<const uint64_t> hist) {
  if (hist.size() > static_cast<size_t>(calib_math::kMaxBins)) {
    fail_internal(std::string(fn) + ": " + std::to_string(hist.size()) + " bins, at most " +
                  std::to_string(calib_math::kMaxBins));
  }
  uint64_t total = 0;
  for (uint64_t v : hist) {
    // Counts stay below 2^53, so every count and partial sum converts to double exactly.
    if (v > (uint64_t{1} << 53) - total) fail_internal(std::string(fn) + ": counts exceed 2^53");
    total += v;
  }
  if (total == 0) fail_internal(std::string(fn) + ": empty histogram");
  return total;
}

// The last of the least scores (ties go to more kept bins); `first` is the kept count of
// scores[0].
ThresholdChoice pick_least(const std::vector<double>& scores, int64_t first) {
  ThresholdChoice best{first, scores.front()};
  for (size_t k = 1; k < scores.size(); ++k) {
    if (scores[k] <= best.score) best = {first + static_cast<int64_t>(k), scores[k]};
  }
  return best;
}

}  // namespace

namespace {

// The pieces one after another: the CUDA kernels read one host array.
[[maybe_unused]] std::span<const float> joined(FloatPieces pieces, std::vector<float>& storage) {
  if (pieces.size() == 1) return pieces[0];
  storage.clear();
  for (const std::span<const float> piece : pieces) {
    storage.insert(storage.end(), piece.begin(), piece.end());
  }
  return storage;
}

bool all_empty(FloatPieces pieces) {
  return std::all_of(pieces.begin(), pieces.end(), [](const auto& p) { return p.empty(); });
}

}  // namespace

ValueRange minmax(std::span<const float> x, Device device, KernelWorkspace* workspace) {
  const std::span<const float> one[] = {x};
  return minmax(FloatPieces(one), device, workspace);
}

ValueRange minmax(FloatPieces pieces, Device device,
                  [[maybe_unused]] KernelWorkspace* workspace) {
  const bool cuda = kernel_uses_cuda(device);
  if (all_empty(pieces)) return {};
  if (cuda) {
#ifdef QFORGE_HAVE_CUDA
    KernelWorkspace call;  // this call's buffers, when the caller keeps none
    std::vector<float> storage;
    return cuda::minmax(joined(pieces, storage), workspace != nullptr ? *workspace : call);
#endif
  }
  return cpu::minmax(pieces);
}

float histogram_scale(float range_max, size_t bins) { return static_cast<float>(bins) / range_max; }

uint64_t histogram_abs(std::span<const float> x, float range_max, std::span<uint64_t> bins,
                       Device device, [[maybe_unused]] KernelWorkspace* workspace) {
  if (!std::isfinite(range_max) || !(range_max > 0.0f)) {
    fail_internal("histogram_abs: range_max " + std::to_string(range_max) +
                  " must be finite and > 0");
  }
  if (bins.empty() || bins.size() > (size_t{1} << 24)) {
    fail_internal("histogram_abs: " + std::to_string(bins.size()) + " bins, need 1 to 2^24");
  }
  const float scale = histogram_scale(range_max, bins.size());
  if (!std::isfinite(scale)) {
    fail_internal("histogram_abs: range_max " + std::to_string(range_max) + " is too small for " +
                  std::to_string(bins.size()) + " bins");
  }
  const bool cuda = kernel_uses_cuda(device);
  if (x.empty()) return 0;
  if (cuda) {
#ifdef QFORGE_HAVE_CUDA
    KernelWorkspace call;
    return cuda::histogram_abs(x, scale, bins, workspace != nullptr ? *workspace : call);
#endif
  }
  return cpu::histogram_abs(x, scale, bins);
}

uint64_t histogram_abs_pow2(std::span<const float> x, int exponent, std::span<uint64_t> bins,
                            Device device, KernelWorkspace* workspace) {
  const std::span<const float> one[] = {x};
  return histogram_abs_pow2(FloatPieces(one), exponent, bins, device, workspace);
}

uint64_t histogram_abs_pow2(FloatPieces pieces, int exponent, std::span<uint64_t> bins,
                            Device device, [[maybe_unused]] KernelWorkspace* workspace) {
  if (exponent < -127 || exponent > 126) {
    fail_internal("histogram_abs_pow2: bin width 2^" + std::to_string(exponent) +
                  " outside 2^-127 .. 2^126");
  }
  if (bins.empty() || bins.size() > (size_t{1} << 24)) {
    fail_internal("histogram_abs_pow2: " + std::to_string(bins.size()) +
                  " bins, need 1 to 2^24");
  }
  const float scale = std::ldexp(1.0f, -exponent);
  if (all_empty(pieces)) return 0;
  if (kernel_uses_cuda(device)) {
#ifdef QFORGE_HAVE_CUDA
    KernelWorkspace call;
    std::vector<float> storage;
    return cuda::histogram_abs(joined(pieces, storage), scale, bins,
                               workspace != nullptr ? *workspace : call);
#endif
  }
  return cpu::histogram_abs(pieces, scale, bins);
}

int histogram_exponent(float amax, int64_t bins) {
  const auto n = static_cast<double>(bins);
  // bins * 2^e <= amax for this e (2^ilogb(x) <= x < 2^(ilogb(x) + 1)); a step or two up from it.
  int e = amax > 0.0f ? std::ilogb(amax) - std::ilogb(n) - 1 : -127;
  e = std::max(e, -127);
  while (std::ldexp(n, e) <= static_cast<double>(amax)) ++e;
  return e;
}

void widen_pow2_bins(std::span<uint64_t> bins, int widen) {
  if (widen <= 0) return;
  for (size_t i = 1; i < bins.size(); ++i) {
    const size_t to = widen >= 63 ? 0 : i >> widen;
    if (to == i) continue;
    bins[to] += bins[i];
    bins[i] = 0;
  }
}

RangeHistogram range_histogram_abs_pow2(FloatPieces pieces, int floor_exponent,
                                        std::span<uint64_t> bins, Device device,
                                        KernelWorkspace* workspace) {
  if (floor_exponent != kNoExponent && (floor_exponent < -127 || floor_exponent > 126)) {
    fail_internal("range_histogram_abs_pow2: bin width 2^" + std::to_string(floor_exponent) +
                  " outside 2^-127 .. 2^126");
  }
  if (bins.empty() || bins.size() > (size_t{1} << 24)) {
    fail_internal("range_histogram_abs_pow2: " + std::to_string(bins.size()) +
                  " bins, need 1 to 2^24");
  }
  if (!kernel_uses_cuda(device)) return cpu::range_histogram_abs_pow2(pieces, floor_exponent, bins);
  // The device's kernels one after the other: the range, then the bins at the width it needs.
  RangeHistogram out;
  out.range = minmax(pieces, device, workspace);
  const float amax = std::fmax(std::fabs(out.range.min), std::fabs(out.range.max));
  if (!std::isfinite(amax) || (floor_exponent == kNoExponent && amax == 0.0f)) return out;
  out.exponent =
      std::max(floor_exponent, histogram_exponent(amax, static_cast<int64_t>(bins.size())));
  out.binned = true;
  histogram_abs_pow2(pieces, out.exponent, bins, device, workspace);
  return out;
}

namespace {

// entropy_scores of every histogram in `hists`, those on the CPU searched together.
std::vector<std::vector<double>> entropy_scores_all(
    std::span<const std::span<const uint64_t>> hists, int quant_levels, Device device) {
  std::vector<std::vector<double>> scores(hists.size());
  // TensorRT's zero bin: bin 0 counts as bin 1 does (see kernels/calib.h). Done here, once, so
  // that every backend searches the same histogram.
  std::vector<std::vector<uint64_t>> searched(hists.size());
  std::vector<std::span<const uint64_t>> cpu_hists;
  std::vector<std::span<double>> cpu_scores;
  for (size_t h = 0; h < hists.size(); ++h) {
    const std::span<const uint64_t> hist = hists[h];
    checked_total("entropy_scores", hist);
    const auto nb = static_cast<int64_t>(hist.size());
    if (quant_levels < 1 || quant_levels > calib_math::kMaxLevels || quant_levels > nb) {
      fail_internal("entropy_scores: " + std::to_string(quant_levels) + " levels for " +
                    std::to_string(nb) + " bins; need 1 <= levels <= min(bins, 1024)");
    }
    scores[h].resize(static_cast<size_t>(nb - quant_levels + 1));
    searched[h].assign(hist.begin(), hist.end());
    if (nb >= 2) searched[h][0] = searched[h][1];
    uint64_t total = 0;
    for (uint64_t v : searched[h]) total += v;
    if (total == 0) {  // every value was in bin 0: nothing to compare, keep everything
      std::fill(scores[h].begin(), scores[h].end(), std::numeric_limits<double>::infinity());
      continue;
    }
    if (kernel_uses_cuda(device)) {
#ifdef QFORGE_HAVE_CUDA
      cuda::entropy_scores(searched[h], total, quant_levels, scores[h]);
      continue;
#endif
    }
    cpu_hists.emplace_back(searched[h]);
    cpu_scores.emplace_back(scores[h]);
  }
  if (!cpu_hists.empty()) cpu::entropy_scores_many(cpu_hists, quant_levels, cpu_scores);
  return scores;
}

}  // namespace

std::vector<double> entropy_scores(std::span<const uint64_t> hist, int quant_levels,
                                   Device device) {
  const std::span<const uint64_t> hists[1] = {hist};
  return std::move(entropy_scores_all(hists, quant_levels, device)[0]);
}

ThresholdChoice entropy_threshold(std::span<const uint64_t> hist, int quant_levels, Device device) {
  return pick_least(entropy_scores(hist, quant_levels, device), quant_levels);
}

std::vector<ThresholdChoice> entropy_thresholds(std::span<const std::span<const uint64_t>> hists,
                                                int quant_levels, Device device) {
  std::vector<ThresholdChoice> out;
  for (const std::vector<double>& s : entropy_scores_all(hists, quant_levels, device)) {
    out.push_back(pick_least(s, quant_levels));
  }
  return out;
}

namespace {

void check_mse_search(int64_t nb, int quant_max) {
  if (quant_max < 1 || quant_max >= nb) {
    fail_internal("mse_scores: quant_max " + std::to_string(quant_max) + " for " +
                  std::to_string(nb) + " bins; need 1 <= quant_max < bins");
  }
}

}  // namespace

std::vector<double> mse_scores(std::span<const uint64_t> hist, int quant_max, Device device) {
  [[maybe_unused]] const uint64_t total = checked_total("mse_scores", hist);
  const auto nb = static_cast<int64_t>(hist.size());
  check_mse_search(nb, quant_max);
  std::vector<double> scores(static_cast<size_t>(nb - quant_max));
  if (kernel_uses_cuda(device)) {
#ifdef QFORGE_HAVE_CUDA
    cuda::mse_scores(hist, total, quant_max, scores);
    return scores;
#endif
  }
  cpu::mse_scores(hist, quant_max, scores);
  return scores;
}

ThresholdChoice mse_threshold(std::span<const uint64_t> hist, int quant_max, Device device) {
  return pick_least(mse_scores(hist, quant_max, device), int64_t{quant_max} + 1);
}

std::vector<ThresholdChoice> mse_thresholds(std::span<const std::span<const uint64_t>> hists,
                                            int quant_max, Device device) {
  std::vector<ThresholdChoice> out(hists.size());
  for (const std::span<const uint64_t> hist : hists) {
    checked_total("mse_thresholds", hist);
    check_mse_search(static_cast<int64_t>(hist.size()), quant_max);
  }
  if (kernel_uses_cuda(device)) {  // one search per histogram on the device
    for (size_t i = 0; i < hists.size(); ++i) out[i] = mse_threshold(hists[i], quant_max, device);
    return out;
  }
  std::vector<std::vector<double>> scores;  // all searched together (cpu::mse_scores_many)
  for (const std::span<const uint64_t> hist : hists) {
    scores.emplace_back(hist.size() - static_cast<size_t>(quant_max));
  }
  const std::vector<std::span<double>> views(scores.begin(), scores.end());
  cpu::mse_scores_many(hists, quant_max, views);
  for (size_t i = 0; i < hists.size(); ++i) {
    out[i] = pick_least(scores[i], int64_t{quant_max} + 1);
  }
  return out;
}

double percentile_threshold(std::span<const uint64_t> hist, double percentile) {
  if (!(percentile > 0.0 && percentile <= 100.0)) {
    fail_internal("percentile_threshold: percentile " + std::to_string(percentile) +
                  " is not in (0, 100]");
  }
  uint64_t total = 0;
  for (uint64_t v : hist) total += v;
  if (total == 0) return 0.0;
  const double target = percentile / 100.0 * static_cast<double>(total);
  uint64_t below = 0;  // counts in bins [0, j)
  for (size_t j = 0; j < hist.size(); ++j) {
    const uint64_t h = hist[j];
    if (h > 0 && static_cast<double>(below + h) >= target) {
      const double inside = (target - static_cast<double>(below)) / static_cast<double>(h);
      return static_cast<double>(j) + std::clamp(inside, 0.0, 1.0);
    }
    below += h;
  }
  // Rounding left the target a hair above the total: everything is below the last count.
  for (size_t j = hist.size(); j-- > 0;) {
    if (hist[j] > 0) return static_cast<double>(j + 1);
  }
  return 0.0;
}

}  // namespace qforge
