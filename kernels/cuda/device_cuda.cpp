#include "kernels/cuda/device_cuda.h"

#include <cuda_runtime.h>

namespace qforge::cuda {

DeviceProbe probe_device() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error so later calls start clean
    return {false, cudaGetErrorString(err)};
  }
  if (count == 0) return {false, "cudaGetDeviceCount found 0 devices"};
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) {
    cudaGetLastError();
    return {true, "device 0"};
  }
  return {true, std::string(prop.name) + " (" + std::to_string(count) + " device" +
                    (count > 1 ? "s" : "") + ")"};
}

}  // namespace qforge::cuda
