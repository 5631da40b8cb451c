#include "kernels/device.h"

#include <omp.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <string>

#include "ir/error.h"
#include "qforge/cublas_config.h"
#ifdef QFORGE_HAVE_CUDA
#include "kernels/cuda/device_cuda.h"
#endif
#if QFORGE_HAVE_CUBLAS
#include "kernels/cuda/cublas_loader.h"
#endif

namespace qforge {

namespace {

struct CudaState {
  bool available = false;
  std::string detail;  // device name, or the reason there is none
};

// Probed once: the answer does not change while the process runs, and cudaGetDeviceCount
// costs a driver initialisation the first time.
const CudaState& cuda_state() {
  static const CudaState state = [] {
#ifdef QFORGE_HAVE_CUDA
    const cuda::DeviceProbe probe = cuda::probe_device();
    return probe.available ? CudaState{true, probe.detail}
                           : CudaState{false, "no CUDA device: " + probe.detail};
#else
    return CudaState{false, "CUDA not built in"};
#endif
  }();
  return state;
}

// What Auto resolves to. A device that answers is not enough: the CUDA paths also load cuBLAS at
// first use, and a run that chose CUDA and then cannot load it would fail half-way (a LoRA
// product, a Gemm on the device). So Auto loads it up front and takes the CPU, saying why, when
// it cannot.
const CudaState& auto_state() {
  static const CudaState state = []() -> CudaState {
    const CudaState& cuda = cuda_state();
    if (!cuda.available) return cuda;
#if QFORGE_HAVE_CUBLAS
    try {
      cuda::load_cublas();
    } catch (const Error& e) {
      return {false, "CUDA device " + cuda.detail + " answers, but " + e.what()};
    }
#endif
    return cuda;
  }();
  return state;
}

std::atomic<int> g_cpu_threads{0};

}  // namespace

std::string_view device_name(Device device) {
  switch (device) {
    case Device::Auto:
      return "auto";
    case Device::Cpu:
      return "cpu";
    case Device::Cuda:
      return "cuda";
  }
  return "?";
}

bool cuda_built() {
#ifdef QFORGE_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

bool cuda_available() { return cuda_state().available; }

bool auto_uses_cuda() { return auto_state().available; }

Device resolve_device(Device requested) {
  const CudaState& cuda = cuda_state();
  switch (requested) {
    case Device::Cpu:
      return Device::Cpu;
    case Device::Cuda:
      if (!cuda.available) {
        fail_unsupported("--device cuda: " + cuda.detail + "; use --device cpu or auto");
      }
      return Device::Cuda;
    case Device::Auto: {
      const CudaState& chosen = auto_state();
      if (chosen.available) {
        spdlog::info("device auto: using CUDA on {}", chosen.detail);
        return Device::Cuda;
      }
      spdlog::info("device auto: using CPU ({} threads): {}", cpu_threads(), chosen.detail);
      return Device::Cpu;
    }
  }
  fail_internal("resolve_device: unknown device");
}

bool kernel_uses_cuda(Device device) {
  switch (device) {
    case Device::Cpu:
      return false;
    case Device::Cuda:
      return resolve_device(Device::Cuda) == Device::Cuda;
    case Device::Auto:
      return auto_uses_cuda();
  }
  return false;
}

void set_cpu_threads(int threads) {
  if (threads < 0) {
    fail_usage("--threads " + std::to_string(threads) + ": use 0 (all cores) or a positive count");
  }
  g_cpu_threads.store(threads, std::memory_order_relaxed);
}

int cpu_threads() {
  const int threads = g_cpu_threads.load(std::memory_order_relaxed);
  return threads > 0 ? threads : omp_get_max_threads();
}

}  // namespace qforge
