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

// The per-block scale search (Int4Scale::Mse). Candidate magnitudes m < kMagnitudeCount:
// fp16(amax * kClipRatios[m] / 7) for m < kClipRatioCount, then fp16(amax / 8). A scale may be
// negative: q in [-8, 7] then spans [-7|s|, 8|s|], so the extreme's side gets the 8th level
// (ONNX Runtime's MatMulNBitsQuantizer and llama.cpp's Q4_0 map the signed extreme to -8 that way).
// Candidate k < kMagnitudeCount is magnitude k, positive; k >= kMagnitudeCount is magnitude
// k - kMagnitudeCount + 1, negative (-amax / 7 would only mirror amax / 7: same error). Edge
// cases as scale_bits, on the magnitude. The ratios are literal floats so the CUDA twin
// multiplies the same.
constexpr int kClipRatioCount = 11;
constexpr float kClipRatios[kClipRatioCount] = {1.00f, 0.98f, 0.96f, 0.94f, 0.92f, 0.90f,
                                                0.88f, 0.86f, 0.84f, 0.82f, 0.80f};
constexpr int kMagnitudeCount = kClipRatioCount + 1;
constexpr int kScaleCandidates = 2 * kMagnitudeCount - 1;
constexpr uint16_t kF16SignBit = 0x8000;

inline uint16_t candidate_scale_bits(float amax, int k) {
  if (amax == 0.0f) return kF16One;
  const int m = k < kMagnitudeCount ? k : k - kMagnitudeCount + 1;
  const float v = m < kClipRatioCount ? (amax * kClipRatios[m]) / 7.0f : amax / 8.0f;
  uint16_t bits = f32_to_f16(v);
  if (bits == 0) bits = kF16MinSubnormal;
  if (bits >= kF16Inf) bits = kF16MaxFinite;
  return k < kMagnitudeCount ? bits : static_cast<uint16_t>(bits | kF16SignBit);
}

// After the candidates, the best scale so far is refined by least squares: for its codes q the
// scale minimising sum (w - s q)^2 is sum(w q) / sum(q^2) (llama.cpp's quantizers refine the
// same way). Its fp16 rounding is evaluated as any candidate, with codes recomputed from it, and
// kept only when strictly better; at most kRefineRounds times. sum(w q) is exact per term in
// double (24 + 4 bits) and summed in row order; sum(q^2) is an integer. Returns 0 (no
// refinement) when sum(q^2) is 0 or the quotient is not finite; else the fp16 bits, magnitude
// clamped as scale_bits does, sign kept.
constexpr int kRefineRounds = 2;

inline uint16_t refined_scale_bits(double sum_wq, double sum_qq) {
  if (!(sum_qq > 0.0)) return 0;
  const double ls = sum_wq / sum_qq;
  if (!std::isfinite(ls)) return 0;
  const uint16_t bits = f32_to_f16(static_cast<float>(ls));
  const auto sign = static_cast<uint16_t>(bits & kF16SignBit);
  auto magnitude = static_cast<uint16_t>(bits & 0x7fff);
  if (magnitude == 0) magnitude = kF16MinSubnormal;
  if (magnitude >= kF16Inf) magnitude = kF16MaxFinite;
  return static_cast<uint16_t>(sign | magnitude);
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

// One element's part in a scale's evaluation: adds its squared reconstruction error
// (w - s * q)^2 to `error` and its least-squares terms w * q and q * q (refined_scale_bits) to
// the sums, all in double. s * q is exact in float (11 + 4 significant bits), e * e and w * q
// exact in double (2 x 24 and 24 + 4 bits), so the sums are the same whether or not a compiler
// fuses the multiply-adds, and the CUDA twin, adding in the same row order, gets the same bits.
inline void accumulate_fit(float w, float scale, double& error, double& sum_wq, double& sum_qq) {
  const auto q = static_cast<float>(quantize_one(w, scale));
  const float e = w - scale * q;
  error += static_cast<double>(e) * static_cast<double>(e);
  sum_wq += static_cast<double>(w) * static_cast<double>(q);
  sum_qq += static_cast<double>(q) * static_cast<double>(q);
}

inline uint8_t nibble(int8_t q) { return static_cast<uint8_t>(q) & 0x0fu; }
inline int8_t from_nibble(uint8_t n) { return static_cast<int8_t>((n & 0x07u) - (n & 0x08u)); }

}  // namespace qforge::int4_math
