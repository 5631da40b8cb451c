// CUDA twin of kernels/cpu/quantize_cpu.cpp. Same contract (kernels/quantize.h), bit-identical
// results: amax is a max over integer bit patterns, quantize uses IEEE division (nvcc's default
// -prec-div=true; this file must not be built with --use_fast_math) and rintf, which rounds half
// to even as std::nearbyint does on the CPU.
#include <bit>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/quantize_cuda.h"

namespace qforge::cuda {

static __device__ __forceinline__ int8_t quantize_one(float x, float scale) {
  float v = x / scale;
  if (isnan(v)) return 0;
  v = fminf(fmaxf(v, -127.0f), 127.0f);  // ±127 are integers: clamping first commutes with rint
  return static_cast<int8_t>(rintf(v));
}

static __device__ __forceinline__ int64_t channel_of(int64_t k, int64_t channels, int64_t inner) {
  return (k / inner) % channels;
}

static __global__ void amax_kernel(const float* x, int64_t n, uint32_t* result) {
  uint32_t m = 0;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < n;
       k += stride) {
    m = max(m, abs_bits(x[k]));
  }
  m = block_reduce_max(m);
  if (threadIdx.x == 0) atomicMax(result, m);  // one atomic per block; max is order-independent
}

// One block per channel (grid-stride over channels), so each channel's max is reduced in one
// block and written once, with no atomics.
static __global__ void amax_per_channel_kernel(const float* x, int64_t outer, int64_t channels,
                                               int64_t inner, uint32_t* out) {
  const int64_t per_channel = outer * inner;
  for (int64_t c = blockIdx.x; c < channels; c += gridDim.x) {
    uint32_t m = 0;
    for (int64_t j = threadIdx.x; j < per_channel; j += blockDim.x) {
      const int64_t o = j / inner;
      m = max(m, abs_bits(x[(o * channels + c) * inner + (j - o * inner)]));
    }
    m = block_reduce_max(m);
    if (threadIdx.x == 0) out[c] = m;
  }
}

static __global__ void quantize_int8_kernel(const float* x, int64_t n, int64_t channels,
                                            int64_t inner, const float* scales, int8_t* out) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < n;
       k += stride) {
    out[k] = quantize_one(x[k], scales[channel_of(k, channels, inner)]);
  }
}

static __global__ void dequantize_int8_kernel(const int8_t* q, int64_t n, int64_t channels,
                                              int64_t inner, const float* scales, float* out) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < n;
       k += stride) {
    out[k] = static_cast<float>(q[k]) * scales[channel_of(k, channels, inner)];
  }
}

static void launch_amax(const float* x, int64_t n, uint32_t* result, cudaStream_t stream) {
  CUDA_CHECK(cudaMemsetAsync(result, 0, sizeof(uint32_t), stream));
  amax_kernel<<<grid_for(n), kBlockSize, 0, stream>>>(x, n, result);
  CUDA_CHECK(cudaGetLastError());
}

static void launch_amax_per_channel(const float* x, int64_t outer, int64_t channels, int64_t inner,
                                    uint32_t* out, cudaStream_t stream) {
  const unsigned grid = static_cast<unsigned>(channels < kMaxGrid ? channels : kMaxGrid);
  amax_per_channel_kernel<<<grid, kBlockSize, 0, stream>>>(x, outer, channels, inner, out);
  CUDA_CHECK(cudaGetLastError());
}

static void launch_quantize_int8(const float* x, int64_t n, int64_t channels, int64_t inner,
                                 const float* scales, int8_t* out, cudaStream_t stream) {
  quantize_int8_kernel<<<grid_for(n), kBlockSize, 0, stream>>>(x, n, channels, inner, scales, out);
  CUDA_CHECK(cudaGetLastError());
}

static void launch_dequantize_int8(const int8_t* q, int64_t n, int64_t channels, int64_t inner,
                                   const float* scales, float* out, cudaStream_t stream) {
  dequantize_int8_kernel<<<grid_for(n), kBlockSize, 0, stream>>>(q, n, channels, inner, scales,
                                                                 out);
  CUDA_CHECK(cudaGetLastError());
}

// Host-buffer entry points: copy in, launch on the default stream, copy out (the blocking copy
// back also reports any error the kernel raised). Device buffers come from `workspace`.
float amax(std::span<const float> x, KernelWorkspace& workspace) {
  const auto n = static_cast<int64_t>(x.size());
  WorkspaceBuffer<float> d_x(workspace, 0, x.size());
  WorkspaceBuffer<uint32_t> d_result(workspace, 1, 1);
  d_x.upload(x);
  launch_amax(d_x.get(), n, d_result.get(), nullptr);
  uint32_t bits = 0;
  d_result.download(std::span<uint32_t>(&bits, 1));
  return std::bit_cast<float>(bits);
}

void amax_per_channel(std::span<const float> x, int64_t outer, int64_t channels, int64_t inner,
                      std::span<float> out, KernelWorkspace& workspace) {
  WorkspaceBuffer<float> d_x(workspace, 0, x.size());
  WorkspaceBuffer<uint32_t> d_out(workspace, 1, out.size());
  d_x.upload(x);
  launch_amax_per_channel(d_x.get(), outer, channels, inner, d_out.get(), nullptr);
  // float and uint32_t share size and representation: the bits land as the floats they encode.
  CUDA_CHECK(
      cudaMemcpy(out.data(), d_out.get(), out.size() * sizeof(float), cudaMemcpyDeviceToHost));
}

void quantize_int8(std::span<const float> x, int64_t channels, int64_t inner,
                   std::span<const float> scales, std::span<int8_t> out,
                   KernelWorkspace& workspace) {
  WorkspaceBuffer<float> d_x(workspace, 0, x.size());
  WorkspaceBuffer<float> d_scales(workspace, 1, scales.size());
  WorkspaceBuffer<int8_t> d_out(workspace, 2, out.size());
  d_x.upload(x);
  d_scales.upload(scales);
  launch_quantize_int8(d_x.get(), static_cast<int64_t>(x.size()), channels, inner, d_scales.get(),
                       d_out.get(), nullptr);
  d_out.download(out);
}

void dequantize_int8(std::span<const int8_t> q, int64_t channels, int64_t inner,
                     std::span<const float> scales, std::span<float> out,
                     KernelWorkspace& workspace) {
  WorkspaceBuffer<int8_t> d_q(workspace, 0, q.size());
  WorkspaceBuffer<float> d_scales(workspace, 1, scales.size());
  WorkspaceBuffer<float> d_out(workspace, 2, out.size());
  d_q.upload(q);
  d_scales.upload(scales);
  launch_dequantize_int8(d_q.get(), static_cast<int64_t>(q.size()), channels, inner, d_scales.get(),
                         d_out.get(), nullptr);
  d_out.download(out);
}

}  // namespace qforge::cuda
