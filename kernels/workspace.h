#pragma once
// Device memory a pass keeps for its length. The CUDA backends of kernels/quantize.h,
// kernels/calib.h and kernels/int4.h take host buffers: each call copies its inputs to the
// device and its results back, and without a workspace it also allocates and frees its device
// buffers every time. Given one, a call takes its buffers from the workspace, grown when a call
// needs more and freed with the workspace, so a pass that runs kernels per weight, per batch or
// per search point allocates a few times in all. CPU backends never touch it.
//
// One workspace serves one call at a time: a pass that runs kernels from several threads at
// once gives each thread its own, or none.
#include <cstddef>
#include <cstdint>
#include <memory>

namespace qforge {

class KernelWorkspace {
 public:
  static constexpr int kSlots = 4;  // device buffers one call may hold at once

  KernelWorkspace();
  ~KernelWorkspace();
  KernelWorkspace(const KernelWorkspace&) = delete;
  KernelWorkspace& operator=(const KernelWorkspace&) = delete;

  // Device allocations made so far (tests: a second call of the same size allocates nothing).
  [[nodiscard]] int64_t device_allocations() const { return allocations_; }

  // For the CUDA backends: device memory of at least `bytes` for buffer `slot` (0 .. kSlots - 1)
  // of the current call. Its contents are not kept when it grows. Error(Internal) for a bad slot
  // or in a build without CUDA.
  void* device_buffer(int slot, size_t bytes);

 private:
  struct Buffer {
    std::shared_ptr<void> memory;  // frees itself (cudaFree)
    size_t bytes = 0;
  };
  Buffer buffers_[kSlots];
  int64_t allocations_ = 0;
};

}  // namespace qforge
