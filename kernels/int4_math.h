#pragma once
// Scalar pieces of kernels/int4.h shared by the dispatch, the CPU backend and the tests' reference.
// The CUDA twin (kernels/cuda/int4.cu) repeats them with device intrinsics that round the same way.
#include <bit>
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

// The per-block scale search (Int4Scale::Mse): candidate k < kClipRatioCount is
// fp16(amax * kClipRatios[k] / 7); the last one is fp16(amax / 8), ONNX Runtime's full-range
// mapping (exact for a negative extreme, which lands on -8; a positive one clips to 7 * scale).
// Edge cases as scale_bits. The ratios are literal floats so the CUDA twin multiplies the same.
constexpr int kClipRatioCount = 11;
constexpr float kClipRatios[kClipRatioCount] = {1.00f, 0.98f, 0.96f, 0.94f, 0.92f, 0.90f,
                                                0.88f, 0.86f, 0.84f, 0.82f, 0.80f};
constexpr int kScaleCandidates = kClipRatioCount + 1;

inline uint16_t candidate_scale_bits(float amax, int k) {
  if (amax == 0.0f) return kF16One;
  const float v = k < kClipRatioCount ? (amax * kClipRatios[k]) / 7.0f : amax / 8.0f;
  const uint16_t bits = f32_to_f16(v);
  if (bits == 0) return kF16MinSubnormal;
  if (bits >= kF16Inf) return kF16MaxFinite;
  return bits;
}

// Adding and subtracting 1.5 * 2^23 rounds |v| <= 2^22 to an integer, half to even, under the
// default rounding mode: std::nearbyint's result without its libm call per element.
constexpr float kRoundMagic = 12582912.0f;

constexpr int32_t kBits8 = 0x41000000;    // 8.0f
constexpr int32_t kBitsInf = 0x7f800000;  // +Inf

// clamp(round_half_even(w / scale), -8, 7); NaN -> 0. IEEE division, as QuantizeLinear. The
// magnitude is clamped to 8 on its bits (integer order is float order there; also catches Inf
// and NaN without float compares, which GCC will not if-convert under -ftrapping-math), then
// rounded, then 8 becomes 7: the same result as clamping to [-8, 7] first, as 7 and 8 are
// integers.
inline int8_t quantize_one(float w, float scale) {
  const auto bits = std::bit_cast<int32_t>(w / scale);
  const int32_t magnitude = bits & 0x7fffffff;
  int32_t clamped = magnitude > kBits8 ? kBits8 : magnitude;
  clamped = magnitude > kBitsInf ? 0 : clamped;  // NaN
  const auto v = std::bit_cast<float>((bits & INT32_MIN) | clamped);
  const auto r = static_cast<int32_t>((v + kRoundMagic) - kRoundMagic);
  return static_cast<int8_t>(r > 7 ? 7 : r);
}

// One element's squared reconstruction error, (w - s * q)^2, summed in double. s * q is exact in
// float (11 + 4 significant bits) and e * e exact in double (2 x 24 bits), so the value is the
// same whether or not a compiler fuses the multiply-adds: the CUDA twin sums identically.
inline double squared_error(float w, float scale) {
  const float e = w - scale * static_cast<float>(quantize_one(w, scale));
  return static_cast<double>(e) * static_cast<double>(e);
}

inline uint8_t nibble(int8_t q) { return static_cast<uint8_t>(q) & 0x0fu; }
inline int8_t from_nibble(uint8_t n) { return static_cast<int8_t>((n & 0x07u) - (n & 0x08u)); }

}  // namespace qforge::int4_math
