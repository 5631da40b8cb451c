// CUDA twin of kernels/cpu/int4_cpu.cpp. Same contract (kernels/int4.h), bit-identical results:
// __float2half_rn rounds to nearest even as ir/half.h does, the division is IEEE (nvcc's default
// -prec-div=true; no --use_fast_math) and rintf rounds half to even as std::nearbyint.
#include <cuda_fp16.h>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/int4_cuda.h"

namespace qforge::cuda {

static __device__ __forceinline__ uint16_t scale_bits(float amax) {
  if (amax == 0.0f) return 0x3c00;  // 1.0
  const uint16_t bits = __half_as_ushort(__float2half_rn(amax / 7.0f));
  if (bits == 0) return 0x0001;       // smallest subnormal
  if (bits >= 0x7c00) return 0x7bff;  // largest finite
  return bits;
}

// kernels/int4_math.h's candidate_scale_bits: the same literal ratios, the same IEEE operations.
static __constant__ float kClipRatios[11] = {1.00f, 0.98f, 0.96f, 0.94f, 0.92f, 0.90f,
                                             0.88f, 0.86f, 0.84f, 0.82f, 0.80f};
constexpr int kClipRatioCount = 11;
constexpr int kMagnitudeCount = kClipRatioCount + 1;
constexpr int kScaleCandidates = 2 * kMagnitudeCount - 1;
constexpr int kRefineRounds = 2;

static __device__ __forceinline__ uint16_t candidate_scale_bits(float amax, int k) {
  if (amax == 0.0f) return 0x3c00;  // 1.0
  const int m = k < kMagnitudeCount ? k : k - kMagnitudeCount + 1;
  const float v = m < kClipRatioCount ? __fdiv_rn(__fmul_rn(amax, kClipRatios[m]), 7.0f)
                                      : __fdiv_rn(amax, 8.0f);
  uint16_t bits = __half_as_ushort(__float2half_rn(v));
  if (bits == 0) bits = 0x0001;
  if (bits >= 0x7c00) bits = 0x7bff;
  return k < kMagnitudeCount ? bits : static_cast<uint16_t>(bits | 0x8000);
}

// int4_math::refined_scale_bits: double quotient, rounded to float, then to fp16, as the CPU.
static __device__ __forceinline__ uint16_t refined_scale_bits(double sum_wq, double sum_qq) {
  if (!(sum_qq > 0.0)) return 0;
  const double ls = __ddiv_rn(sum_wq, sum_qq);
  if (!isfinite(ls)) return 0;
  const uint16_t bits = __half_as_ushort(__float2half_rn(__double2float_rn(ls)));
  const auto sign = static_cast<uint16_t>(bits & 0x8000);
  auto magnitude = static_cast<uint16_t>(bits & 0x7fff);
  if (magnitude == 0) magnitude = 0x0001;
  if (magnitude >= 0x7c00) magnitude = 0x7bff;
  return static_cast<uint16_t>(sign | magnitude);
}

static __device__ __forceinline__ int quantize_value(float w, float scale) {
  const float v = w / scale;
  if (isnan(v)) return 0;
  return static_cast<int>(rintf(fminf(fmaxf(v, -8.0f), 7.0f)));
}

static __device__ __forceinline__ uint8_t quantize_nibble(float w, float scale) {
  return static_cast<uint8_t>(quantize_value(w, scale)) & 0x0fu;
}

// int4_math::accumulate_fit: s * q is exact in float, e * e and w * q in double, so the
// explicitly rounded operations give the CPU's values, fused there or not.
struct ScaleFit {
  double error, sum_wq, sum_qq;
};

static __device__ ScaleFit evaluate_scale(const float* w, int64_t cols, int64_t c, int64_t r0,
                                          int64_t r1, uint16_t bits) {
  const float s = __half2float(__ushort_as_half(bits));
  ScaleFit fit{0.0, 0.0, 0.0};
  for (int64_t r = r0; r < r1; ++r) {
    const float x = w[r * cols + c];
    const auto q = static_cast<float>(quantize_value(x, s));
    const float e = __fsub_rn(x, __fmul_rn(s, q));
    fit.error = __dadd_rn(fit.error, __dmul_rn(static_cast<double>(e), static_cast<double>(e)));
    fit.sum_wq = __dadd_rn(fit.sum_wq, __dmul_rn(static_cast<double>(x), static_cast<double>(q)));
    fit.sum_qq = __dadd_rn(fit.sum_qq, __dmul_rn(static_cast<double>(q), static_cast<double>(q)));
  }
  return fit;
}

static __device__ __forceinline__ float dequantize_nibble(uint8_t nib, float scale) {
  const int q = static_cast<int>(nib & 0x07u) - static_cast<int>(nib & 0x08u);
  return static_cast<float>(q) * scale;
}

// One thread per (block, column): consecutive threads read consecutive columns (coalesced). The
// search sums the error over the block's rows in row order, as the CPU backend.
static __global__ void int4_scales_kernel(const float* w, int64_t rows, int64_t cols,
                                          int64_t block_size, int64_t blocks, bool search,
                                          uint16_t* scales) {
  const int64_t total = blocks * cols;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < total;
       t += stride) {
    const int64_t b = t / cols;
    const int64_t c = t - b * cols;
    const int64_t end = min(rows, (b + 1) * block_size);
    uint32_t m = 0;
    for (int64_t r = b * block_size; r < end; ++r) m = max(m, abs_bits(w[r * cols + c]));
    const float amax = m >= 0x7f800000u ? 0.0f : __uint_as_float(m);  // non-finite: caller's
    uint16_t chosen = scale_bits(amax);
    if (search) {
      const int64_t r0 = b * block_size;
      ScaleFit best{0.0, 0.0, 0.0};
      for (int k = 0; k < kScaleCandidates; ++k) {
        const uint16_t bits = candidate_scale_bits(amax, k);
        const ScaleFit fit = evaluate_scale(w, cols, c, r0, end, bits);
        if (k == 0 || fit.error < best.error) {  // strictly better: ties keep the earlier one
          best = fit;
          chosen = bits;
        }
      }
      for (int round = 0; round < kRefineRounds; ++round) {
        const uint16_t next = refined_scale_bits(best.sum_wq, best.sum_qq);
        if (next == 0 || next == chosen) break;
        const ScaleFit fit = evaluate_scale(w, cols, c, r0, end, next);
        if (!(fit.error < best.error)) break;
        best = fit;
        chosen = next;
      }
    }
    scales[t] = chosen;
  }
}

// One thread per packed byte (two elements), so no byte is written twice.
static __global__ void int4_pack_kernel(const float* w, int64_t n, int64_t cols, int64_t block_size,
                                        const uint16_t* scales, uint8_t* packed) {
  const int64_t bytes = (n + 1) / 2;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < bytes;
       j += stride) {
    uint8_t byte = 0;
    for (int64_t e = 2 * j; e < min(n, 2 * j + 2); ++e) {
      const int64_t r = e / cols;
      const int64_t c = e - r * cols;
      const float s = __half2float(__ushort_as_half(scales[(r / block_size) * cols + c]));
      byte = static_cast<uint8_t>(byte | (quantize_nibble(w[e], s) << (4 * (e % 2))));
    }
    packed[j] = byte;
  }
}

static __global__ void int4_dequantize_kernel(const uint8_t* packed, int64_t n, int64_t cols,
                                              int64_t block_size, const uint16_t* scales,
                                              float* out) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n;
       e += stride) {
    const int64_t r = e / cols;
    const int64_t c = e - r * cols;
    const float s = __half2float(__ushort_as_half(scales[(r / block_size) * cols + c]));
    out[e] = dequantize_nibble(static_cast<uint8_t>(packed[e / 2] >> (4 * (e % 2))), s);
  }
}

static void launch_quantize_int4(const float* w, int64_t rows, int64_t cols, int64_t block_size,
                                 bool search, uint16_t* scales, uint8_t* packed,
                                 cudaStream_t stream) {
  const int64_t blocks = (rows + block_size - 1) / block_size;
  int4_scales_kernel<<<grid_for(blocks * cols), kBlockSize, 0, stream>>>(w, rows, cols, block_size,
                                                                         blocks, search, scales);
  CUDA_CHECK(cudaGetLastError());
  const int64_t n = rows * cols;
  int4_pack_kernel<<<grid_for((n + 1) / 2), kBlockSize, 0, stream>>>(w, n, cols, block_size, scales,
                                                                     packed);
  CUDA_CHECK(cudaGetLastError());
}

static void launch_dequantize_int4(const uint8_t* packed, int64_t rows, int64_t cols,
                                   int64_t block_size, const uint16_t* scales, float* out,
                                   cudaStream_t stream) {
  const int64_t n = rows * cols;
  int4_dequantize_kernel<<<grid_for(n), kBlockSize, 0, stream>>>(packed, n, cols, block_size,
                                                                 scales, out);
  CUDA_CHECK(cudaGetLastError());
}

void quantize_int4_blocked(std::span<const float> w, int64_t rows, int64_t cols, int64_t block_size,
                           std::span<uint16_t> scales_f16, std::span<uint8_t> packed,
                           bool search_scale, KernelWorkspace& workspace) {
  WorkspaceBuffer<float> d_w(workspace, 0, w.size());
  WorkspaceBuffer<uint16_t> d_scales(workspace, 1, scales_f16.size());
  WorkspaceBuffer<uint8_t> d_packed(workspace, 2, packed.size());
  d_w.upload(w);
  launch_quantize_int4(d_w.get(), rows, cols, block_size, search_scale, d_scales.get(),
                       d_packed.get(), nullptr);
  d_scales.download(scales_f16);
  d_packed.download(packed);
}

// The packed weight and its scales stay on the device between the two kernels: one upload.
void int4_round_trip(std::span<const float> w, int64_t rows, int64_t cols, int64_t block_size,
                     std::span<uint16_t> scales_f16, std::span<uint8_t> packed,
                     std::span<float> out, bool search_scale, KernelWorkspace& workspace) {
  WorkspaceBuffer<float> d_w(workspace, 0, w.size());
  WorkspaceBuffer<uint16_t> d_scales(workspace, 1, scales_f16.size());
  WorkspaceBuffer<uint8_t> d_packed(workspace, 2, packed.size());
  WorkspaceBuffer<float> d_out(workspace, 3, out.size());
  d_w.upload(w);
  launch_quantize_int4(d_w.get(), rows, cols, block_size, search_scale, d_scales.get(),
                       d_packed.get(), nullptr);
  launch_dequantize_int4(d_packed.get(), rows, cols, block_size, d_scales.get(), d_out.get(),
                         nullptr);
  d_scales.download(scales_f16);
  d_packed.download(packed);
  d_out.download(out);
}

void dequantize_int4_blocked(std::span<const uint8_t> packed, std::span<const uint16_t> scales_f16,
                             int64_t rows, int64_t cols, int64_t block_size, std::span<float> out,
                             KernelWorkspace& workspace) {
  WorkspaceBuffer<uint8_t> d_packed(workspace, 0, packed.size());
  WorkspaceBuffer<uint16_t> d_scales(workspace, 1, scales_f16.size());
  WorkspaceBuffer<float> d_out(workspace, 2, out.size());
  d_packed.upload(packed);
  d_scales.upload(scales_f16);
  launch_dequantize_int4(d_packed.get(), rows, cols, block_size, d_scales.get(), d_out.get(),
                         nullptr);
  d_out.download(out);
}

}  // namespace qforge::cuda
