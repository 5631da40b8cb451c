#pragma once
// Device allocations for kernels/workspace.h, compiled only when QFORGE_HAVE_CUDA. Plain C++ so
// that the workspace can include it without nvcc.
#include <cstddef>
#include <memory>

namespace qforge::cuda {

// cudaMalloc of max(bytes, 1) bytes, freed (cudaFree) with the last copy of the pointer.
// Error(Internal) naming the size when the device has no room.
std::shared_ptr<void> device_allocate(size_t bytes);

}  // namespace qforge::cuda
