#include "kernels/cuda/device_memory.h"

#include <cuda_runtime.h>

#include <string>

#include "ir/error.h"

namespace qforge::cuda {

std::shared_ptr<void> device_allocate(size_t bytes) {
  void* p = nullptr;
  const cudaError_t status = cudaMalloc(&p, bytes > 0 ? bytes : 1);
  if (status != cudaSuccess) {
    cudaGetLastError();  // clear it, so that later calls start clean
    fail_internal("CUDA error in cudaMalloc of " + std::to_string(bytes) +
                  " bytes: " + cudaGetErrorString(status));
  }
  // No throw from a deleter; an error in cudaFree surfaces at the next call.
  return std::shared_ptr<void>(p, [](void* q) { cudaFree(q); });
}

}  // namespace qforge::cuda
