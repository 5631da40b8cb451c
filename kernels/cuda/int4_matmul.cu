// CUDA W4A16 product (contract: kernels/int4_matmul.h). Weights stay packed in global memory
// and are dequantized in registers; activations are fp16 (or f32) and accumulate in f32.
//
// A thread block is 32 x NY threads. Lane x owns CPT adjacent output columns; row y of the
// block takes K blocks y, y + NY, ... (strided, so every warp streams the weight), and each
// thread keeps MT x CPT f32 accumulators, MT rows of X at once. The NY partial sums meet in
// shared memory and warp row 0 adds them in order 0..NY-1; when the tiles alone would not fill
// the GPU, K is also split over grid.z and the slices' sums are added in slice order by a
// second kernel. Either way the result is deterministic.
// Two instantiations: batch 1 (GEMV: MT 1, CPT 8, NY 8) and small M (MT 16, CPT 4, NY 4;
// grid.y tiles M, so any M works, best up to a few dozen rows).
#include <cuda_fp16.h>

#include <algorithm>
#include <string>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/int4_matmul_cuda.h"

namespace qforge::cuda {

namespace {

__device__ __forceinline__ float load_f(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ float load_f(const __half* p, int64_t i) { return __half2float(p[i]); }

__device__ __forceinline__ float signed_nibble(uint32_t v) {
  return static_cast<float>(static_cast<int32_t>(v << 28) >> 28);
}

template <int MT, int CPT, int NY, typename TX, typename TS>
__global__ void __launch_bounds__(32 * NY)
    int4_matmul_kernel(const TX* __restrict__ x, int64_t m, int64_t k, int64_t n, int64_t bs,
                       const uint8_t* __restrict__ packed, const TS* __restrict__ scales,
                       const int8_t* __restrict__ zeros, bool round16, float* __restrict__ y32,
                       __half* __restrict__ y16, float* __restrict__ slices) {
  static_assert(CPT % 2 == 0, "columns per thread come in byte pairs");
  __shared__ float partial[NY][MT][32 * CPT];
  const int64_t c0 = (static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x) * CPT;
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * MT;
  const int rows = static_cast<int>(min(static_cast<int64_t>(MT), m - m0));
  const int64_t blocks = (k + bs - 1) / bs;
  // Whole byte pairs when N is even (then r * n + c0 is even); 32-bit loads when also 8 | N.
  const bool pairs = n % 2 == 0 && c0 + CPT <= n;
  const bool words = CPT == 8 && n % 8 == 0 && c0 + CPT <= n;

  float acc[MT][CPT];
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int j = 0; j < CPT; ++j) acc[i][j] = 0.0f;

  if (c0 < n) {
    // Slice z of gridDim.z takes K blocks z * NY + y, then every NY * gridDim.z further.
    const int64_t stride = static_cast<int64_t>(NY) * gridDim.z;
    for (int64_t b = static_cast<int64_t>(blockIdx.z) * NY + threadIdx.y; b < blocks; b += stride) {
      float s[CPT], z[CPT];
#pragma unroll
      for (int j = 0; j < CPT; ++j) {
        const int64_t c = c0 + j;
        s[j] = c < n ? load_f(scales, b * n + c) : 0.0f;
        z[j] = c < n && zeros != nullptr ? static_cast<float>(zeros[b * n + c]) : 0.0f;
      }
      const int64_t end = min(k, (b + 1) * bs);
      for (int64_t r = b * bs; r < end; ++r) {
        float w[CPT];
        const int64_t e0 = r * n + c0;
        if (words) {
          const uint32_t v = *reinterpret_cast<const uint32_t*>(packed + e0 / 2);
#pragma unroll
          for (int j = 0; j < CPT; ++j) w[j] = (signed_nibble(v >> (4 * j)) - z[j]) * s[j];
        } else if (pairs) {
#pragma unroll
          for (int j = 0; j < CPT; j += 2) {
            const uint32_t v = packed[(e0 + j) / 2];
            w[j] = (signed_nibble(v) - z[j]) * s[j];
            w[j + 1] = (signed_nibble(v >> 4) - z[j + 1]) * s[j + 1];
          }
        } else {
#pragma unroll
          for (int j = 0; j < CPT; ++j) {
            const int64_t e = e0 + j;
            const uint32_t v = c0 + j < n ? packed[e / 2] >> (4 * (e % 2)) : 0u;
            w[j] = (signed_nibble(v) - z[j]) * s[j];
          }
        }
        if (round16) {
#pragma unroll
          for (int j = 0; j < CPT; ++j) w[j] = __half2float(__float2half_rn(w[j]));
        }
#pragma unroll
        for (int i = 0; i < MT; ++i) {
          if (i < rows) {
            const float xv = load_f(x, (m0 + i) * k + r);
#pragma unroll
            for (int j = 0; j < CPT; ++j) acc[i][j] = fmaf(xv, w[j], acc[i][j]);
          }
        }
      }
    }
  }

#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int j = 0; j < CPT; ++j) partial[threadIdx.y][i][threadIdx.x * CPT + j] = acc[i][j];
  __syncthreads();
  if (threadIdx.y != 0 || c0 >= n) return;
  for (int i = 0; i < rows; ++i) {
#pragma unroll
    for (int j = 0; j < CPT; ++j) {
      if (c0 + j >= n) break;
      float sum = 0.0f;
#pragma unroll
      for (int t = 0; t < NY; ++t) sum += partial[t][i][threadIdx.x * CPT + j];
      const int64_t o = (m0 + i) * n + c0 + j;
      if (slices != nullptr) {  // split K: this slice's sum, added up by sum_slices_kernel
        slices[static_cast<int64_t>(blockIdx.z) * m * n + o] = sum;
      } else if (y16 != nullptr) {
        y16[o] = __float2half_rn(sum);
      } else {
        y32[o] = sum;
      }
    }
  }
}

// y = the K slices' partial sums added in slice order (deterministic).
__global__ void sum_slices_kernel(const float* __restrict__ slices, int64_t count, int ksplit,
                                  float* __restrict__ y32, __half* __restrict__ y16) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < count;
       e += stride) {
    float sum = 0.0f;
    for (int z = 0; z < ksplit; ++z) sum += slices[z * count + e];
    if (y16 != nullptr) {
      y16[e] = __float2half_rn(sum);
    } else {
      y32[e] = sum;
    }
  }
}

int sm_count() {
  static const int count = [] {
    int dev = 0, sms = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    return sms > 0 ? sms : 1;
  }();
  return count;
}

template <int MT, int CPT, int NY, typename TX, typename TS>
void launch(const Int4MatmulDeviceArgs& a, cudaStream_t stream) {
  const int64_t col_blocks = (a.n + 32 * CPT - 1) / (32 * CPT);
  const int64_t row_blocks = (a.m + MT - 1) / MT;
  if (row_blocks > 65535 || col_blocks > 0x7fffffff) {
    fail_unsupported("int4_matmul on CUDA: M " + std::to_string(a.m) + " x N " +
                     std::to_string(a.n) + " exceeds the launch grid");
  }
  // Few column x row tiles (a GEMV's N / 256) would leave most SMs idle: split K over
  // grid.z until there are about two thread blocks per SM, each slice keeping at least one K
  // block per warp row. The slices' sums go to a scratch buffer and are added in order.
  const int64_t k_blocks = (a.k + a.block_size - 1) / a.block_size;
  const int64_t tiles = col_blocks * row_blocks;
  int64_t ksplit = std::min<int64_t>((2 * sm_count() + tiles - 1) / tiles, k_blocks / NY);
  ksplit = std::max<int64_t>(1, std::min<int64_t>(ksplit, 64));
  const dim3 grid(static_cast<unsigned>(col_blocks), static_cast<unsigned>(row_blocks),
                  static_cast<unsigned>(ksplit));
  const dim3 block(32, NY);
  float* y32 = a.y_f16 ? nullptr : static_cast<float*>(a.y);
  __half* y16 = a.y_f16 ? static_cast<__half*>(a.y) : nullptr;
  float* slices = nullptr;
  const int64_t count = a.m * a.n;
  if (ksplit > 1) {
    CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&slices),
                               static_cast<size_t>(ksplit * count) * sizeof(float), stream));
  }
  int4_matmul_kernel<MT, CPT, NY, TX, TS><<<grid, block, 0, stream>>>(
      static_cast<const TX*>(a.x), a.m, a.k, a.n, a.block_size, a.packed,
      static_cast<const TS*>(a.scales), a.zero_points, a.round_to_f16, y32, y16, slices);
  CUDA_CHECK(cudaGetLastError());
  if (ksplit > 1) {
    sum_slices_kernel<<<grid_for(count), kBlockSize, 0, stream>>>(
        slices, count, static_cast<int>(ksplit), y32, y16);
    CUDA_CHECK(cudaGetLastError());
    CUDA_CHECK(cudaFreeAsync(slices, stream));
  }
}

template <typename TX, typename TS>
void launch_for_m(const Int4MatmulDeviceArgs& a, cudaStream_t stream) {
  if (a.m == 1) {
    launch<1, 8, 8, TX, TS>(a, stream);
  } else {
    launch<16, 4, 4, TX, TS>(a, stream);
  }
}

}  // namespace

void int4_matmul_device(const Int4MatmulDeviceArgs& a, void* stream_ptr) {
  if (a.m == 0 || a.n == 0) return;
  auto* stream = static_cast<cudaStream_t>(stream_ptr);
  if (a.x_f16) {
    if (a.scales_f16) {
      launch_for_m<__half, __half>(a, stream);
    } else {
      launch_for_m<__half, float>(a, stream);
    }
  } else {
    if (a.scales_f16) {
      launch_for_m<float, __half>(a, stream);
    } else {
      launch_for_m<float, float>(a, stream);
    }
  }
}

void int4_matmul_host(const void* x, bool x_f16, int64_t m, const Int4Weight& w, float* y) {
  const size_t x_bytes = static_cast<size_t>(m * w.k) * (x_f16 ? 2 : 4);
  DeviceBuffer<uint8_t> d_x(x_bytes);
  DeviceBuffer<uint8_t> d_packed(w.packed.size());
  const bool f16 = !w.scales_f16.empty();
  const size_t scale_bytes = f16 ? w.scales_f16.size_bytes() : w.scales_f32.size_bytes();
  DeviceBuffer<uint8_t> d_scales(scale_bytes);
  DeviceBuffer<int8_t> d_zeros(w.zero_points.size());
  DeviceBuffer<float> d_y(static_cast<size_t>(m * w.n));
  CUDA_CHECK(cudaMemcpy(d_x.get(), x, x_bytes, cudaMemcpyHostToDevice));
  d_packed.upload(w.packed);
  CUDA_CHECK(cudaMemcpy(d_scales.get(),
                        f16 ? static_cast<const void*>(w.scales_f16.data()) : w.scales_f32.data(),
                        scale_bytes, cudaMemcpyHostToDevice));
  if (!w.zero_points.empty()) d_zeros.upload(w.zero_points);
  Int4MatmulDeviceArgs a;
  a.x = d_x.get();
  a.x_f16 = x_f16;
  a.m = m;
  a.k = w.k;
  a.n = w.n;
  a.block_size = w.block_size;
  a.packed = d_packed.get();
  a.scales = d_scales.get();
  a.scales_f16 = f16;
  a.zero_points = w.zero_points.empty() ? nullptr : d_zeros.get();
  a.round_to_f16 = w.round_to_f16;
  a.y = d_y.get();
  a.y_f16 = false;
  int4_matmul_device(a, nullptr);
  CUDA_CHECK(cudaMemcpy(y, d_y.get(), static_cast<size_t>(m * w.n) * sizeof(float),
                        cudaMemcpyDeviceToHost));
}

}  // namespace qforge::cuda
