#pragma once
// CUDA side of device selection, compiled only when QFORGE_HAVE_CUDA. Plain C++ so that
// kernels/device.cpp can include it without nvcc.
#include <string>

namespace qforge::cuda {

struct DeviceProbe {
  bool available = false;
  std::string detail;  // the device's name when available, else why not (CUDA's error string)
};

// Asks the CUDA runtime for a device (cudaGetDeviceCount). Never throws.
DeviceProbe probe_device();

}  // namespace qforge::cuda
