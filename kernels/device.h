#pragma once
// Which backend runs a kernel. `Auto` picks CUDA when the binary was built with it, a device
// answers and the libraries the CUDA paths load at run time (cuBLAS, where built with it) load;
// else CPU. It logs which, and why.
#include <string_view>

namespace qforge {

enum class Device { Auto, Cpu, Cuda };

std::string_view device_name(Device device);
bool cuda_built();                           // compiled with CUDA kernels
bool cuda_available();                       // built with CUDA and a device answers
bool auto_uses_cuda();  // cuda_available() and cuBLAS loads (where built with it): what Auto picks
// Auto -> Cuda or Cpu (logged, one info line); Cuda without a device -> Error(Unsupported) saying
// why.
Device resolve_device(Device requested);
// The per-call choice of a kernel's dispatch (kernels/*.cpp): Cpu -> false; Cuda -> true, or
// Error(Unsupported) without a device; Auto -> auto_uses_cuda(), silently (kernels run per
// tensor; the caller logged its choice once through resolve_device).
bool kernel_uses_cuda(Device device);

// Threads for CPU kernels (0 = all cores). Results never depend on it.
void set_cpu_threads(int threads);
int cpu_threads();

}  // namespace qforge
