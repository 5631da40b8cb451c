#pragma once
// Shared pieces of the CUDA kernels: error checking, warp/block reductions, device buffers.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "ir/error.h"
#include "kernels/workspace.h"

// Every CUDA runtime call goes through this: a failure is a bug or a broken device, so it
// becomes Error(Internal) naming the call, file and line.
#define CUDA_CHECK(expr) ::qforge::cuda::check_status((expr), #expr, __FILE__, __LINE__)

namespace qforge::cuda {

inline void check_status(cudaError_t status, const char* expr, const char* file, int line) {
  if (status == cudaSuccess) return;
  fail_internal(std::string("CUDA error at ") + file + ":" + std::to_string(line) + " in " + expr +
                ": " + cudaGetErrorString(status));
}

constexpr int kWarpSize = 32;
constexpr int kBlockSize = 256;     // a multiple of kWarpSize, as block_reduce_max needs
constexpr int64_t kMaxGrid = 4096;  // grid-stride loops cover the rest

inline unsigned grid_for(int64_t n) {
  const int64_t blocks = (n + kBlockSize - 1) / kBlockSize;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > kMaxGrid ? kMaxGrid : blocks));
}

__device__ __forceinline__ uint32_t warp_reduce_max(uint32_t v) {
  for (int offset = kWarpSize / 2; offset > 0; offset >>= 1) {
    v = max(v, __shfl_xor_sync(0xffffffffu, v, offset));
  }
  return v;
}

// Max over the block; the result is valid in thread 0. Every thread of the block must call it
// (it synchronises), and blockDim.x must be a multiple of kWarpSize.
__device__ __forceinline__ uint32_t block_reduce_max(uint32_t v) {
  __shared__ uint32_t warp_max[kWarpSize];
  const unsigned lane = threadIdx.x % kWarpSize;
  const unsigned warp = threadIdx.x / kWarpSize;
  v = warp_reduce_max(v);
  __syncthreads();  // a previous call's readers are done with warp_max
  if (lane == 0) warp_max[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < blockDim.x / kWarpSize ? warp_max[lane] : 0u;
    v = warp_reduce_max(v);
  }
  return v;
}

// |v| as bits: non-negative floats order as unsigned ints, with finite < +Inf < NaN.
__device__ __forceinline__ uint32_t abs_bits(float v) { return __float_as_uint(v) & 0x7fffffffu; }

// Device memory for `count` elements of T, freed on scope exit.
template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t count) : count_(count) {
    if (count_ > 0) CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&ptr_), count_ * sizeof(T)));
  }
  ~DeviceBuffer() {
    if (ptr_ != nullptr) cudaFree(ptr_);  // no throw from a destructor; errors surface elsewhere
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* get() const { return ptr_; }
  void upload(std::span<const T> host) {
    CUDA_CHECK(cudaMemcpy(ptr_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  void download(std::span<T> host) const {
    CUDA_CHECK(cudaMemcpy(host.data(), ptr_, host.size() * sizeof(T), cudaMemcpyDeviceToHost));
  }

 private:
  T* ptr_ = nullptr;
  size_t count_ = 0;
};

// Buffer `slot` of a workspace as `count` elements of T, for the length of one host entry point.
// The entry points take the caller's workspace (kernels/workspace.h) or, without one, a local
// workspace that frees its buffers on return.
template <typename T>
class WorkspaceBuffer {
 public:
  WorkspaceBuffer(KernelWorkspace& workspace, int slot, size_t count)
      : ptr_(static_cast<T*>(workspace.device_buffer(slot, count * sizeof(T)))) {}

  T* get() const { return ptr_; }
  void upload(std::span<const T> host) {
    CUDA_CHECK(cudaMemcpy(ptr_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  void download(std::span<T> host) const {
    CUDA_CHECK(cudaMemcpy(host.data(), ptr_, host.size() * sizeof(T), cudaMemcpyDeviceToHost));
  }

 private:
  T* ptr_;
};

}  // namespace qforge::cuda
