#pragma once
// CUDA backend of kernels/int4_matmul.h, compiled only when QFORGE_HAVE_CUDA. Two entry points:
// host buffers in and out (the dispatch, the tests), and device pointers on a stream (the
// runtime's CUDA executor). Arguments are validated by the callers.
#include <cstdint>

#include "kernels/int4_matmul.h"

namespace qforge::cuda {

// x: [m, k] host f32 (x_f16 false) or fp16 bits (true); y: [m, n] host f32.
void int4_matmul_host(const void* x, bool x_f16, int64_t m, const Int4Weight& w, float* y);

// Device pointers. scales are fp16 (scales_f16) or f32; zero_points may be null; y is f32 or
// fp16 (y_f16). `stream` is a cudaStream_t (null: the default stream).
struct Int4MatmulDeviceArgs {
  const void* x = nullptr;
  bool x_f16 = true;
  int64_t m = 0, k = 0, n = 0, block_size = 0;
  const uint8_t* packed = nullptr;
  const void* scales = nullptr;
  bool scales_f16 = true;
  const int8_t* zero_points = nullptr;
  bool round_to_f16 = false;  // see Int4Weight::round_to_f16
  void* y = nullptr;
  bool y_f16 = false;
};
void int4_matmul_device(const Int4MatmulDeviceArgs& args, void* stream);

}  // namespace qforge::cuda
