// Backend dispatch and argument checks for kernels/int4_matmul.h. Backends trust what arrives.
#include "kernels/int4_matmul.h"

#include <limits>
#include <string>
#include <vector>

#include "ir/error.h"
#include "ir/half.h"
#include "kernels/cpu/int4_matmul_cpu.h"
#include "kernels/int4.h"
#ifdef QFORGE_HAVE_CUDA
#include "kernels/cuda/int4_matmul_cuda.h"
#endif

namespace qforge {

namespace {

constexpr const char* kFn = "int4_matmul";

void expect_size(const char* what, size_t actual, int64_t expected) {
  if (static_cast<int64_t>(actual) != expected) {
    fail_internal(std::string(kFn) + ": " + what + " has " + std::to_string(actual) +
                  " elements, the shapes need " + std::to_string(expected));
  }
}

void check_weight(const Int4Weight& w) {
  if (w.k < 0 || w.n < 0 || w.block_size < 1 ||
      (w.n != 0 && w.k > std::numeric_limits<int64_t>::max() / w.n)) {
    fail_internal(std::string(kFn) + ": bad weight view [" + std::to_string(w.k) + ", " +
                  std::to_string(w.n) + "] block_size " + std::to_string(w.block_size));
  }
  expect_size("packed weight", w.packed.size(), int4_packed_bytes(w.k * w.n));
  const int64_t scales = int4_block_count(w.k, w.block_size) * w.n;
  if (w.scales_f16.empty() == w.scales_f32.empty() && scales != 0) {
    fail_internal(std::string(kFn) + ": give exactly one of scales_f16 and scales_f32");
  }
  expect_size("scales", w.scales_f16.empty() ? w.scales_f32.size() : w.scales_f16.size(),
              scales);
  if (!w.zero_points.empty()) expect_size("zero points", w.zero_points.size(), scales);
}

void check_xy(size_t x, int64_t m, const Int4Weight& w, size_t y) {
  if (m < 0) fail_internal(std::string(kFn) + ": m " + std::to_string(m) + " < 0");
  expect_size("x", x, m * w.k);
  expect_size("y", y, m * w.n);
}

}  // namespace

void int4_matmul(std::span<const float> x, int64_t m, const Int4Weight& w, std::span<float> y,
                 Device device, int threads) {
  check_weight(w);
  check_xy(x.size(), m, w, y.size());
  const bool cuda = kernel_uses_cuda(device);
  if (y.empty()) return;
  if (cuda) {
#ifdef QFORGE_HAVE_CUDA
    return cuda::int4_matmul_host(x.data(), false, m, w, y.data());
#endif
  }
  cpu::int4_matmul(x.data(), m, w, y.data(), threads > 0 ? threads : cpu_threads());
}

void int4_matmul_f16(std::span<const uint16_t> x, int64_t m, const Int4Weight& w,
                     std::span<float> y, Device device, int threads) {
  check_weight(w);
  check_xy(x.size(), m, w, y.size());
  const bool cuda = kernel_uses_cuda(device);
  if (y.empty()) return;
  if (cuda) {
#ifdef QFORGE_HAVE_CUDA
    return cuda::int4_matmul_host(x.data(), true, m, w, y.data());
#endif
  }
  std::vector<float> xf(x.size());
  for (size_t i = 0; i < x.size(); ++i) xf[i] = f16_to_f32(x[i]);
  cpu::int4_matmul(xf.data(), m, w, y.data(), threads > 0 ? threads : cpu_threads());
}

void int4_dequantize_weight(const Int4Weight& w, std::span<float> out) {
  check_weight(w);
  expect_size("out", out.size(), w.k * w.n);
  for (int64_t r = 0; r < w.k; ++r) {
    for (int64_t c = 0; c < w.n; ++c) {
      const int64_t e = r * w.n + c;
      const auto byte = static_cast<uint8_t>(w.packed[static_cast<size_t>(e / 2)] >> (4 * (e % 2)));
      const auto q = static_cast<float>(static_cast<int8_t>(static_cast<int8_t>(byte << 4) >> 4));
      const auto s = static_cast<size_t>((r / w.block_size) * w.n + c);
      const float scale = w.scales_f16.empty() ? w.scales_f32[s] : f16_to_f32(w.scales_f16[s]);
      const float zero = w.zero_points.empty() ? 0.0f : static_cast<float>(w.zero_points[s]);
      const float v = (q - zero) * scale;
      out[static_cast<size_t>(e)] = w.round_to_f16 ? f16_to_f32(f32_to_f16(v)) : v;
    }
  }
}

}  // namespace qforge
