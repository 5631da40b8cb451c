#include "kernels/workspace.h"

#include <string>

#include "ir/error.h"
#ifdef QFORGE_HAVE_CUDA
#include "kernels/cuda/device_memory.h"
#endif

namespace qforge {

KernelWorkspace::KernelWorkspace() = default;
KernelWorkspace::~KernelWorkspace() = default;

void* KernelWorkspace::device_buffer(int slot, size_t bytes) {
  if (slot < 0 || slot >= kSlots) {
    fail_internal("KernelWorkspace: slot " + std::to_string(slot) + " is not in 0.." +
                  std::to_string(kSlots - 1));
  }
  Buffer& b = buffers_[slot];
  if (b.memory != nullptr && b.bytes >= bytes) return b.memory.get();
#ifdef QFORGE_HAVE_CUDA
  b.memory.reset();  // free the smaller buffer before asking for the larger one
  b.bytes = 0;
  b.memory = cuda::device_allocate(bytes);
  b.bytes = bytes;
  ++allocations_;
  return b.memory.get();
#else
  fail_internal("KernelWorkspace: device memory asked for in a build without CUDA");
#endif
}

}  // namespace qforge
