// CUDA twin of kernels/cpu/calib_cpu.cpp. Same contract (kernels/calib.h), bit-identical
// results: min/max over integer keys, histograms as exact integer counts with the shared bin
// formula, and threshold scores from kernels/calib_math.h, whose lane-then-tree summation is this
// file's block reduction. Must not be built with --use_fast_math.
#include <cstring>
#include <vector>

#include "kernels/calib_math.h"
#include "kernels/cuda/calib_cuda.h"
#include "kernels/cuda/common.cuh"

namespace qforge::cuda {

namespace cm = calib_math;

static_assert(kBlockSize == cm::kLanes, "the score reduction is one lane per thread");

// Histograms up to this many bins live in shared memory (32-bit counters, 48 KiB); wider ones
// count straight into global memory.
constexpr int64_t kSharedBins = 12288;
// Elements per histogram launch, so that no block's 32-bit shared counter can overflow.
constexpr int64_t kHistLaunchMax = int64_t{1} << 30;

// Unsigned key whose order is the float order with -0.0 < +0.0; decode() inverts it.
static __device__ __forceinline__ uint32_t order_key(uint32_t bits) {
  return bits ^ ((bits & 0x80000000u) ? 0xffffffffu : 0x80000000u);
}
static inline float decode_key(uint32_t key) {
  const uint32_t bits = (key & 0x80000000u) ? key ^ 0x80000000u : ~key;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

static __device__ __forceinline__ uint32_t warp_reduce_min(uint32_t v) {
  for (int offset = kWarpSize / 2; offset > 0; offset >>= 1) {
    v = min(v, __shfl_xor_sync(0xffffffffu, v, offset));
  }
  return v;
}

// Min over the block, valid in thread 0; every thread must call it.
static __device__ __forceinline__ uint32_t block_reduce_min(uint32_t v) {
  __shared__ uint32_t warp_min[kWarpSize];
  const unsigned lane = threadIdx.x % kWarpSize;
  const unsigned warp = threadIdx.x / kWarpSize;
  v = warp_reduce_min(v);
  __syncthreads();
  if (lane == 0) warp_min[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < blockDim.x / kWarpSize ? warp_min[lane] : 0xffffffffu;
    v = warp_reduce_min(v);
  }
  return v;
}

static __global__ void minmax_kernel(const float* x, int64_t n, uint32_t* lo_hi,
                                     unsigned long long* nan) {
  uint32_t lo = 0xffffffffu;
  uint32_t hi = 0;
  unsigned long long nans = 0;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < n;
       k += stride) {
    const uint32_t bits = __float_as_uint(x[k]);
    if ((bits & 0x7fffffffu) > 0x7f800000u) {
      ++nans;
      continue;
    }
    const uint32_t key = order_key(bits);
    lo = min(lo, key);
    hi = max(hi, key);
  }
  lo = block_reduce_min(lo);
  hi = block_reduce_max(hi);
  if (nans > 0) atomicAdd(nan, nans);
  if (threadIdx.x == 0) {
    atomicMin(&lo_hi[0], lo);
    atomicMax(&lo_hi[1], hi);
  }
}

static __device__ __forceinline__ bool magnitude_of(float v, float& magnitude) {
  const uint32_t m = __float_as_uint(v) & 0x7fffffffu;
  magnitude = __uint_as_float(m);
  return m <= 0x7f800000u;  // false for NaN
}

// Per-block histogram in shared memory, then added to the global one.
static __global__ void histogram_shared_kernel(const float* x, int64_t n, float scale, int64_t bins,
                                               unsigned long long* out, unsigned long long* nan) {
  extern __shared__ unsigned int local[];
  for (int64_t b = threadIdx.x; b < bins; b += blockDim.x) local[b] = 0;
  __syncthreads();
  unsigned long long nans = 0;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < n;
       k += stride) {
    float magnitude;
    if (!magnitude_of(x[k], magnitude)) {
      ++nans;
      continue;
    }
    atomicAdd(&local[cm::histogram_bin(magnitude, scale, bins)], 1u);
  }
  __syncthreads();
  for (int64_t b = threadIdx.x; b < bins; b += blockDim.x) {
    if (local[b] != 0) atomicAdd(&out[b], static_cast<unsigned long long>(local[b]));
  }
  if (nans > 0) atomicAdd(nan, nans);
}

static __global__ void histogram_global_kernel(const float* x, int64_t n, float scale, int64_t bins,
                                               unsigned long long* out, unsigned long long* nan) {
  unsigned long long nans = 0;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < n;
       k += stride) {
    float magnitude;
    if (!magnitude_of(x[k], magnitude)) {
      ++nans;
      continue;
    }
    atomicAdd(&out[cm::histogram_bin(magnitude, scale, bins)], 1ull);
  }
  if (nans > 0) atomicAdd(nan, nans);
}

// The kLanes partial sums of the block in `lanes`, reduced as cm::lane_tree_sum does; the
// result is in lanes[0] after the call. Every thread must call it.
static __device__ __forceinline__ void tree_sum(double* lanes) {
  __syncthreads();
  for (int stride = cm::kLanes / 2; stride > 0; stride >>= 1) {
    if (static_cast<int>(threadIdx.x) < stride) {
      lanes[threadIdx.x] = cm::add(lanes[threadIdx.x], lanes[threadIdx.x + stride]);
    }
    __syncthreads();
  }
}

// One block per candidate: block b scores kept = quant_levels + b bins.
static __global__ void entropy_kernel(const uint64_t* hist, int64_t bins, uint64_t total,
                                      int quant_levels, double* scores) {
  __shared__ unsigned long long level_sum[cm::kMaxLevels];
  __shared__ unsigned int level_nonzero[cm::kMaxLevels];
  __shared__ unsigned long long outliers_sum;
  __shared__ double lanes[cm::kLanes];
  const int64_t kept = quant_levels + static_cast<int64_t>(blockIdx.x);
  const int tid = static_cast<int>(threadIdx.x);
  for (int l = tid; l < quant_levels; l += cm::kLanes) {
    level_sum[l] = 0;
    level_nonzero[l] = 0;
  }
  if (tid == 0) outliers_sum = 0;
  __syncthreads();
  unsigned long long out = 0;
  for (int64_t j = kept + tid; j < bins; j += cm::kLanes) out += hist[j];
  if (out > 0) atomicAdd(&outliers_sum, out);
  for (int64_t j = tid; j < kept; j += cm::kLanes) {
    if (hist[j] > 0) {
      const int64_t level = j * quant_levels / kept;
      atomicAdd(&level_sum[level], static_cast<unsigned long long>(hist[j]));
      atomicAdd(&level_nonzero[level], 1u);
    }
  }
  __syncthreads();
  const uint64_t outliers = outliers_sum;
  const cm::EntropyCandidate c = cm::entropy_candidate(total, outliers, hist[kept - 1]);
  if (c.infinite) {  // uniform across the block: no thread reaches the reduction
    if (tid == 0) scores[blockIdx.x] = cm::double_of(0x7ff0000000000000ULL);  // +inf
    return;
  }
  double acc = 0.0;
  for (int64_t j = tid; j < kept; j += cm::kLanes) {
    const uint64_t p = hist[j] + (j == kept - 1 ? outliers : 0);
    if (p == 0) continue;  // a zero term
    const int64_t level = j * quant_levels / kept;
    const double q = cm::div(static_cast<double>(level_sum[level]),
                             static_cast<double>(level_nonzero[level]));
    acc = cm::add(acc, cm::entropy_term(static_cast<double>(p), q, c));
  }
  lanes[tid] = acc;
  tree_sum(lanes);
  if (tid == 0) scores[blockIdx.x] = lanes[0];
}

// One block per candidate: block b scores kept = quant_max + 1 + b bins.
static __global__ void mse_kernel(const uint64_t* hist, int64_t bins, uint64_t total, int quant_max,
                                  double* scores) {
  __shared__ double lanes[cm::kLanes];
  const int64_t kept = quant_max + 1 + static_cast<int64_t>(blockIdx.x);
  const int tid = static_cast<int>(threadIdx.x);
  double acc = 0.0;
  for (int64_t j = tid; j < bins; j += cm::kLanes) {
    const uint64_t h = hist[j];
    if (h == 0) continue;
    acc = cm::add(acc, cm::mul(static_cast<double>(h), cm::mse_bin_error(j, kept, quant_max)));
  }
  lanes[tid] = acc;
  tree_sum(lanes);
  if (tid == 0) scores[blockIdx.x] = cm::div(lanes[0], static_cast<double>(total));
}

static void launch_minmax(const float* x, int64_t n, uint32_t* lo_hi, unsigned long long* nan,
                          cudaStream_t stream) {
  const uint32_t init[2] = {0xffffffffu, 0u};
  CUDA_CHECK(cudaMemcpyAsync(lo_hi, init, sizeof init, cudaMemcpyHostToDevice, stream));
  CUDA_CHECK(cudaMemsetAsync(nan, 0, sizeof(unsigned long long), stream));
  minmax_kernel<<<grid_for(n), kBlockSize, 0, stream>>>(x, n, lo_hi, nan);
  CUDA_CHECK(cudaGetLastError());
}

static void launch_histogram(const float* x, int64_t n, float scale, int64_t bins,
                             unsigned long long* out, unsigned long long* nan,
                             cudaStream_t stream) {
  for (int64_t begin = 0; begin < n; begin += kHistLaunchMax) {
    const int64_t len = n - begin < kHistLaunchMax ? n - begin : kHistLaunchMax;
    if (bins <= kSharedBins) {
      const size_t shared = static_cast<size_t>(bins) * sizeof(unsigned int);
      histogram_shared_kernel<<<grid_for(len), kBlockSize, shared, stream>>>(x + begin, len, scale,
                                                                             bins, out, nan);
    } else {
      histogram_global_kernel<<<grid_for(len), kBlockSize, 0, stream>>>(x + begin, len, scale, bins,
                                                                        out, nan);
    }
    CUDA_CHECK(cudaGetLastError());
  }
}

ValueRange minmax(std::span<const float> x, KernelWorkspace& workspace) {
  const auto n = static_cast<int64_t>(x.size());
  WorkspaceBuffer<float> d_x(workspace, 0, x.size());
  WorkspaceBuffer<uint32_t> d_lo_hi(workspace, 1, 2);
  WorkspaceBuffer<unsigned long long> d_nan(workspace, 2, 1);
  d_x.upload(x);
  launch_minmax(d_x.get(), n, d_lo_hi.get(), d_nan.get(), nullptr);
  uint32_t lo_hi[2] = {0, 0};
  unsigned long long nan = 0;
  d_lo_hi.download(std::span<uint32_t>(lo_hi, 2));
  d_nan.download(std::span<unsigned long long>(&nan, 1));
  ValueRange r;
  r.nan = nan;
  r.count = static_cast<uint64_t>(n) - nan;
  if (r.count > 0) {
    r.min = decode_key(lo_hi[0]);
    r.max = decode_key(lo_hi[1]);
  }
  return r;
}

uint64_t histogram_abs(std::span<const float> x, float scale, std::span<uint64_t> bins,
                       KernelWorkspace& workspace) {
  const auto nb = static_cast<int64_t>(bins.size());
  WorkspaceBuffer<float> d_x(workspace, 0, x.size());
  WorkspaceBuffer<unsigned long long> d_bins(workspace, 1, bins.size());
  WorkspaceBuffer<unsigned long long> d_nan(workspace, 2, 1);
  d_x.upload(x);
  CUDA_CHECK(cudaMemset(d_bins.get(), 0, bins.size() * sizeof(unsigned long long)));
  CUDA_CHECK(cudaMemset(d_nan.get(), 0, sizeof(unsigned long long)));
  launch_histogram(d_x.get(), static_cast<int64_t>(x.size()), scale, nb, d_bins.get(), d_nan.get(),
                   nullptr);
  std::vector<unsigned long long> counts(bins.size());
  d_bins.download(counts);
  unsigned long long nan = 0;
  d_nan.download(std::span<unsigned long long>(&nan, 1));
  for (size_t b = 0; b < bins.size(); ++b) bins[b] += counts[b];  // accumulate, as the CPU does
  return nan;
}

void entropy_scores(std::span<const uint64_t> hist, uint64_t total, int quant_levels,
                    std::span<double> scores) {
  DeviceBuffer<uint64_t> d_hist(hist.size());
  DeviceBuffer<double> d_scores(scores.size());
  d_hist.upload(hist);
  entropy_kernel<<<static_cast<unsigned>(scores.size()), cm::kLanes>>>(
      d_hist.get(), static_cast<int64_t>(hist.size()), total, quant_levels, d_scores.get());
  CUDA_CHECK(cudaGetLastError());
  d_scores.download(scores);
}

void mse_scores(std::span<const uint64_t> hist, uint64_t total, int quant_max,
                std::span<double> scores) {
  DeviceBuffer<uint64_t> d_hist(hist.size());
  DeviceBuffer<double> d_scores(scores.size());
  d_hist.upload(hist);
  mse_kernel<<<static_cast<unsigned>(scores.size()), cm::kLanes>>>(
      d_hist.get(), static_cast<int64_t>(hist.size()), total, quant_max, d_scores.get());
  CUDA_CHECK(cudaGetLastError());
  d_scores.download(scores);
}

}  // namespace qforge::cuda
