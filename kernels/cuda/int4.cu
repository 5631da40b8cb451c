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

static __device__ __forceinline__ uint8_t quantize_nibble(float w, float scale) {
  const float v = w / scale;
  if (isnan(v)) return 0;
  const auto q = static_cast<int>(rintf(fminf(fmaxf(v, -8.0f), 7.0f)));
  return static_cast<uint8_t>(q) & 0x0fu;
}

static __device__ __forceinline__ float dequantize_nibble(uint8_t nib, float scale) {
  const int q = static_cast<int>(nib & 0x07u) - static_cast<int>(nib & 0x08u);
  return static_cast<float>(q) * scale;
}

// One thread per (block, column): consecutive threads read consecutive columns (coalesced).
static __global__ void int4_scales_kernel(const float* w, int64_t rows, int64_t cols,
                                          int64_t block_size, int64_t blocks, uint16_t* scales) {
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
    scales[t] = scale_bits(amax);
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
                                 uint16_t* scales, uint8_t* packed, cudaStream_t stream) {
  const int64_t blocks = (rows + block_size - 1) / block_size;
  int4_scales_kernel<<<grid_for(blocks * cols), kBlockSize, 0, stream>>>(w, rows, cols, block_size,
                                                                         blocks, scales);
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
                           std::span<uint16_t> scales_f16, std::span<uint8_t> packed) {
  DeviceBuffer<float> d_w(w.size());
  DeviceBuffer<uint16_t> d_scales(scales_f16.size());
  DeviceBuffer<uint8_t> d_packed(packed.size());
  d_w.upload(w);
  launch_quantize_int4(d_w.get(), rows, cols, block_size, d_scales.get(), d_packed.get(), nullptr);
  d_scales.download(scales_f16);
  d_packed.download(packed);
}

void dequantize_int4_blocked(std::span<const uint8_t> packed, std::span<const uint16_t> scales_f16,
                             int64_t rows, int64_t cols, int64_t block_size, std::span<float> out) {
  DeviceBuffer<uint8_t> d_packed(packed.size());
  DeviceBuffer<uint16_t> d_scales(scales_f16.size());
  DeviceBuffer<float> d_out(out.size());
  d_packed.upload(packed);
  d_scales.upload(scales_f16);
  launch_dequantize_int4(d_packed.get(), rows, cols, block_size, d_scales.get(), d_out.get(),
                         nullptr);
  d_out.download(out);
}

}  // namespace qforge::cuda
