// Backend dispatch and argument checks for kernels/quantize.h. Backends trust what arrives here.
#include "kernels/quantize.h"

#include <cmath>
#include <limits>
#include <string>

#include "ir/error.h"
#include "kernels/cpu/quantize_cpu.h"
#ifdef QFORGE_HAVE_CUDA
#include "kernels/cuda/quantize_cuda.h"
#endif

namespace qforge {

namespace {

int64_t view_numel(const char* fn, int64_t outer, int64_t channels, int64_t inner) {
  if (outer < 0 || channels < 1 || inner < 0) {
    fail_internal(std::string(fn) + ": bad view [" + std::to_string(outer) + ", " +
                  std::to_string(channels) + ", " + std::to_string(inner) + "]");
  }
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  if ((inner != 0 && outer > kMax / inner) ||
      (outer * inner != 0 && channels > kMax / (outer * inner))) {
    fail_internal(std::string(fn) + ": view size overflows");
  }
  return outer * channels * inner;
}

void expect_size(const char* fn, const char* what, size_t actual, int64_t expected) {
  if (static_cast<int64_t>(actual) != expected) {
    fail_internal(std::string(fn) + ": " + what + " has " + std::to_string(actual) +
                  " elements, the view needs " + std::to_string(expected));
  }
}

void expect_scales(const char* fn, std::span<const float> scales, int64_t channels) {
  expect_size(fn, "scales", scales.size(), channels);
  for (size_t c = 0; c < scales.size(); ++c) {
    if (!std::isfinite(scales[c]) || !(scales[c] > 0.0f)) {
      fail_internal(std::string(fn) + ": scale " + std::to_string(c) + " is " +
                    std::to_string(scales[c]) + ", must be finite and > 0");
    }
  }
}

}  // namespace

float amax(std::span<const float> x, Device device, [[maybe_unused]] KernelWorkspace* workspace) {
  const bool cuda = kernel_uses_cuda(device);
  if (x.empty()) return 0.0f;
  if (cuda) {
#ifdef QFORGE_HAVE_CUDA
    KernelWorkspace call;  // this call's buffers, when the caller keeps none
    return cuda::amax(x, workspace != nullptr ? *workspace : call);
#endif
  }
  return cpu::amax(x);
}

void amax_per_channel(std::span<const float> x, int64_t outer, int64_t channels, int64_t inner,
                      std::span<float> out, Device device,
                      [[maybe_unused]] KernelWorkspace* workspace) {
  const int64_t n = view_numel("amax_per_channel", outer, channels, inner);
  expect_size("amax_per_channel", "x", x.size(), n);
  expect_size("amax_per_channel", "out", out.size(), channels);
  const bool cuda = kernel_uses_cuda(device);
  if (n == 0) {
    for (float& v : out) v = 0.0f;
    return;
  }
  if (cuda) {
#ifdef QFORGE_HAVE_CUDA
    KernelWorkspace call;
    return cuda::amax_per_channel(x, outer, channels, inner, out,
                                  workspace != nullptr ? *workspace : call);
#endif
  }
  cpu::amax_per_channel(x, outer, channels, inner, out);
}

float int8_symmetric_scale(float amax) {
  if (!std::isfinite(amax) || amax < 0.0f) {
    fail_internal("int8_symmetric_scale: amax " + std::to_string(amax) + " is not finite and >= 0");
  }
  if (amax == 0.0f) return 1.0f;
  const float scale = amax / 127.0f;
  return scale > 0.0f ? scale : std::numeric_limits<float>::denorm_min();
}

void quantize_int8(std::span<const float> x, int64_t outer, int64_t channels, int64_t inner,
                   std::span<const float> scales, std::span<int8_t> out, Device device,
                   [[maybe_unused]] KernelWorkspace* workspace) {
  const int64_t n = view_numel("quantize_int8", outer, channels, inner);
  expect_size("quantize_int8", "x", x.size(), n);
  expect_size("quantize_int8", "out", out.size(), n);
  expect_scales("quantize_int8", scales, channels);
  const bool cuda = kernel_uses_cuda(device);
  if (n == 0) return;
  if (cuda) {
#ifdef QFORGE_HAVE_CUDA
    KernelWorkspace call;
    return cuda::quantize_int8(x, channels, inner, scales, out,
                               workspace != nullptr ? *workspace : call);
#endif
  }
  cpu::quantize_int8(x, channels, inner, scales, out);
}

void dequantize_int8(std::span<const int8_t> q, int64_t outer, int64_t channels, int64_t inner,
                     std::span<const float> scales, std::span<float> out, Device device,
                     [[maybe_unused]] KernelWorkspace* workspace) {
  const int64_t n = view_numel("dequantize_int8", outer, channels, inner);
  expect_size("dequantize_int8", "q", q.size(), n);
  expect_size("dequantize_int8", "out", out.size(), n);
  expect_size("dequantize_int8", "scales", scales.size(), channels);
  const bool cuda = kernel_uses_cuda(device);
  if (n == 0) return;
  if (cuda) {
#ifdef QFORGE_HAVE_CUDA
    KernelWorkspace call;
    return cuda::dequantize_int8(q, channels, inner, scales, out,
                                 workspace != nullptr ? *workspace : call);
#endif
  }
  cpu::dequantize_int8(q, channels, inner, scales, out);
}

}  // namespace qforge
