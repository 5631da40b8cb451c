#pragma once
// Scalar pieces of kernels/int4.h shared by the dispatch, the CPU backend and the tests' reference.
// The CUDA twin (kernels/cuda/int4.cu) repeats them with device intrinsics that round the same way.
#include <cmath>
#include <cstdint>

#include "ir/half.h"

namespace qforge::int4_math {

constexpr uint16_t kF16One = 0x3c00;
constexpr uint16_t kF16MinSubnormal = 0x0001;
constexpr uint16_t kF16MaxFinite = 0x7bff;
constexpr uint16_t kF16Inf = 0x7c00;

// fp16(amax / 7), with 0 -> 1.0, underflow -> smallest subnormal, overflow -> largest finite.
inline uint16_t scale_bits(float amax) {
  if (amax == 0.0f) return kF16One;
  const uint16_t bits = f32_to_f16(amax / 7.0f);
  if (bits == 0) return kF16MinSubnormal;
  if (bits >= kF16Inf) return kF16MaxFinite;
  return bits;
}

// Adding and subtracting 1.5 * 2^23 rounds |v| <= 2^22 to an integer, half to even, under the
// default rounding mode: std::nearbyint's result without its libm call per element.
constexpr float kRoundMagic = 12582912.0f;

// clamp(round_half_even(w / scale), -8, 7); NaN -> 0. IEEE division, as QuantizeLinear.
inline int8_t quantize_one(float w, float scale) {
  const float v = w / scale;
  if (std::isnan(v)) return 0;
  const float clamped = std::fmin(std::fmax(v, -8.0f), 7.0f);  // integers: commutes with rounding
  return static_cast<int8_t>((clamped + kRoundMagic) - kRoundMagic);
}

inline uint8_t nibble(int8_t q) { return static_cast<uint8_t>(q) & 0x0fu; }
inline int8_t from_nibble(uint8_t n) { return static_cast<int8_t>((n & 0x07u) - (n & 0x08u)); }

}  // namespace qforge::int4_math
