// Backend dispatch and argument checks for kernels/int4.h. Backends trust what arrives here.
#include "kernels/int4.h"

#include <cmath>
#include <limits>
#include <string>

#include "ir/error.h"
#include "kernels/cpu/int4_cpu.h"
#include "kernels/int4_math.h"
#ifdef QFORGE_HAVE_CUDA
#include "kernels/cuda/int4_cuda.h"
#endif

namespace qforge {

namespace {

// Checks the [rows, cols] view and block size; returns rows * cols.
int64_t checked_numel(const char* fn, int64_t rows, int64_t cols, int64_t block_size) {
  if (rows < 0 || cols < 0 || block_size < 1) {
    fail_internal(std::string(fn) + ": bad view [" + std::to_string(rows) + ", " +
                  std::to_string(cols) + "] block_size " + std::to_string(block_size));
  }
  if (cols != 0 && rows > std::numeric_limits<int64_t>::max() / cols) {
    fail_internal(std::string(fn) + ": view size overflows");
  }
  return rows * cols;
}

void expect_size(const char* fn, const char* what, size_t actual, int64_t expected) {
  if (static_cast<int64_t>(actual) != expected) {
    fail_internal(std::string(fn) + ": " + what + " has " + std::to_string(actual) +
                  " elements, the view needs " + std::to_string(expected));
  }
}

}  // namespace

int64_t int4_block_count(int64_t rows, int64_t block_size) {
  if (rows < 0 || block_size < 1) {
    fail_internal("int4_block_count: rows " + std::to_string(rows) + ", block_size " +
                  std::to_string(block_size));
  }
  return (rows + block_size - 1) / block_size;
}

int64_t int4_packed_bytes(int64_t count) { return (count + 1) / 2; }

uint16_t int4_symmetric_scale_f16(float amax) {
  if (!std::isfinite(amax) || amax < 0.0f) {
    fail_internal("int4_symmetric_scale_f16: amax " + std::to_string(amax) +
                  " is not finite and >= 0");
  }
  return int4_math::scale_bits(amax);
}

void quantize_int4_blocked(std::span<const float> w, int64_t rows, int64_t cols, int64_t block_size,
                           std::span<uint16_t> scales_f16, std::span<uint8_t> packed, Device device,
                           Int4Scale scale, [[maybe_unused]] KernelWorkspace* workspace) {
  const char* fn = "quantize_int4_blocked";
  const int64_t n = checked_numel(fn, rows, cols, block_size);
  expect_size(fn, "w", w.size(), n);
  expect_size(fn, "scales", scales_f16.size(), int4_block_count(rows, block_size) * cols);
  expect_size(fn, "packed", packed.size(), int4_packed_bytes(n));
  const bool cuda = kernel_uses_cuda(device);
  if (n == 0) return;
  if (cuda) {
#ifdef QFORGE_HAVE_CUDA
    KernelWorkspace call;  // this call's buffers, when the caller keeps none
    return cuda::quantize_int4_blocked(w, rows, cols, block_size, scales_f16, packed,
                                       scale == Int4Scale::Mse,
                                       workspace != nullptr ? *workspace : call);
#endif
  }
  cpu::quantize_int4_blocked(w, rows, cols, block_size, scales_f16, packed,
                             scale == Int4Scale::Mse);
}

void int4_round_trip(std::span<const float> w, int64_t rows, int64_t cols, int64_t block_size,
                     std::span<uint16_t> scales_f16, std::span<uint8_t> packed,
                     std::span<float> out, Device device, Int4Scale scale,
                     [[maybe_unused]] KernelWorkspace* workspace) {
  const char* fn = "int4_round_trip";
  const int64_t n = checked_numel(fn, rows, cols, block_size);
  expect_size(fn, "w", w.size(), n);
  expect_size(fn, "scales", scales_f16.size(), int4_block_count(rows, block_size) * cols);
  expect_size(fn, "packed", packed.size(), int4_packed_bytes(n));
  expect_size(fn, "out", out.size(), n);
  const bool cuda = kernel_uses_cuda(device);
  if (n == 0) return;
  if (cuda) {
#ifdef QFORGE_HAVE_CUDA
    KernelWorkspace call;
    return cuda::int4_round_trip(w, rows, cols, block_size, scales_f16, packed, out,
                                 scale == Int4Scale::Mse, workspace != nullptr ? *workspace : call);
#endif
  }
  cpu::quantize_int4_blocked(w, rows, cols, block_size, scales_f16, packed,
                             scale == Int4Scale::Mse);
  cpu::dequantize_int4_blocked(packed, scales_f16, rows, cols, block_size, out);
}

void dequantize_int4_blocked(std::span<const uint8_t> packed, std::span<const uint16_t> scales_f16,
                             int64_t rows, int64_t cols, int64_t block_size, std::span<float> out,
                             Device device, [[maybe_unused]] KernelWorkspace* workspace) {
  const char* fn = "dequantize_int4_blocked";
  const int64_t n = checked_numel(fn, rows, cols, block_size);
  expect_size(fn, "packed", packed.size(), int4_packed_bytes(n));
  expect_size(fn, "scales", scales_f16.size(), int4_block_count(rows, block_size) * cols);
  expect_size(fn, "out", out.size(), n);
  const bool cuda = kernel_uses_cuda(device);
  if (n == 0) return;
  if (cuda) {
#ifdef QFORGE_HAVE_CUDA
    KernelWorkspace call;
    return cuda::dequantize_int4_blocked(packed, scales_f16, rows, cols, block_size, out,
                                         workspace != nullptr ? *workspace : call);
#endif
  }
  cpu::dequantize_int4_blocked(packed, scales_f16, rows, cols, block_size, out);
}

std::string_view int4_scale_name(Int4Scale scale) {
  return scale == Int4Scale::Mse ? "mse" : "amax";
}

void pack_int4(std::span<const int8_t> q, std::span<uint8_t> packed) {
  expect_size("pack_int4", "packed", packed.size(),
              int4_packed_bytes(static_cast<int64_t>(q.size())));
  for (uint8_t& b : packed) b = 0;
  for (size_t i = 0; i < q.size(); ++i) {
    if (q[i] < -8 || q[i] > 7) {
      fail_internal("pack_int4: value " + std::to_string(q[i]) + " at " + std::to_string(i) +
                    " is outside [-8, 7]");
    }
    packed[i / 2] |= static_cast<uint8_t>(int4_math::nibble(q[i]) << (4 * (i % 2)));
  }
}

void unpack_int4(std::span<const uint8_t> packed, std::span<int8_t> q) {
  expect_size("unpack_int4", "packed", packed.size(),
              int4_packed_bytes(static_cast<int64_t>(q.size())));
  for (size_t i = 0; i < q.size(); ++i) {
    q[i] = int4_math::from_nibble(static_cast<uint8_t>(packed[i / 2] >> (4 * (i % 2))));
  }
}

}  // namespace qforge
