#pragma once
// Arithmetic shared by the CPU and CUDA calibration kernels (kernels/calib.h), written once so
// that both backends compute the same bits:
// - every double operation rounds once (nvcc would otherwise fuse a*b+c into an FMA; host code
//   builds in ISO C++ mode, where GCC does not contract, and baseline x86-64 has no FMA),
// - the logarithm is our own (det_log) since CUDA's log and glibc's may differ in the last ulp,
// - sums over bins run in a fixed order: lane t of kLanes adds bins t, t + kLanes, ... in turn,
//   then lanes are combined by a fixed pairwise tree (lane_tree_sum), which is the CUDA block's
//   shared-memory reduction.
// Plain C++ for the host; __host__ __device__ under nvcc.
#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define QF_HD __host__ __device__ __forceinline__
#else
#define QF_HD inline
#endif

namespace qforge::calib_math {

constexpr int kLanes = 256;          // partial sums per candidate; the CUDA block size
constexpr int kMaxLevels = 1024;     // quantization levels the entropy search accepts
constexpr int64_t kMaxBins = 4096;   // histogram bins the threshold searches accept

QF_HD double mul(double a, double b) {
#ifdef __CUDA_ARCH__
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}
QF_HD double add(double a, double b) {
#ifdef __CUDA_ARCH__
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}
QF_HD double sub(double a, double b) {
#ifdef __CUDA_ARCH__
  return __dsub_rn(a, b);
#else
  return a - b;
#endif
}
QF_HD double div(double a, double b) {
#ifdef __CUDA_ARCH__
  return __ddiv_rn(a, b);
#else
  return a / b;
#endif
}

QF_HD uint64_t bits_of(double x) {
#ifdef __CUDA_ARCH__
  return static_cast<uint64_t>(__double_as_longlong(x));
#else
  uint64_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
#endif
}
QF_HD double double_of(uint64_t b) {
#ifdef __CUDA_ARCH__
  return __longlong_as_double(static_cast<long long>(b));
#else
  double x;
  std::memcpy(&x, &b, sizeof x);
  return x;
#endif
}

// Natural log of a finite x > 0, within 1 ulp or so of the exact value, from +, -, *, / only:
// x = m * 2^e with m in [sqrt(1/2), sqrt(2)), log m = 2 atanh(s) with s = (m - 1) / (m + 1),
// |s| < 0.172, summed to s^23 (the next term is below 1e-19 of the result).
// ln 2 split so that e * kDetLogLn2Hi is exact for |e| < 2^11 (det_log's exponent part; the
// CPU search's lanes use the same split).
constexpr double kDetLogLn2Hi = 6.93147180369123816490e-01;
constexpr double kDetLogLn2Lo = 1.90821492927058770002e-10;

QF_HD double det_log(double x) {
  uint64_t b = bits_of(x);
  int e = static_cast<int>((b >> 52) & 0x7ff);
  if (e == 0) {  // subnormal: scale into the normal range first (exact)
    b = bits_of(mul(x, 18014398509481984.0));  // 2^54
    e = static_cast<int>((b >> 52) & 0x7ff) - 54;
  }
  e -= 1023;
  double m = double_of((b & 0x000fffffffffffffULL) | 0x3ff0000000000000ULL);  // [1, 2)
  if (m > 1.4142135623730951) {
    m = mul(m, 0.5);
    e += 1;
  }
  const double s = div(sub(m, 1.0), add(m, 1.0));
  const double s2 = mul(s, s);
  double poly = 1.0 / 23.0;
  poly = add(1.0 / 21.0, mul(s2, poly));
  poly = add(1.0 / 19.0, mul(s2, poly));
  poly = add(1.0 / 17.0, mul(s2, poly));
  poly = add(1.0 / 15.0, mul(s2, poly));
  poly = add(1.0 / 13.0, mul(s2, poly));
  poly = add(1.0 / 11.0, mul(s2, poly));
  poly = add(1.0 / 9.0, mul(s2, poly));
  poly = add(1.0 / 7.0, mul(s2, poly));
  poly = add(1.0 / 5.0, mul(s2, poly));
  poly = add(1.0 / 3.0, mul(s2, poly));
  const double log_m = add(mul(2.0, s), mul(mul(2.0, s), mul(s2, poly)));
  const auto ed = static_cast<double>(e);
  return add(mul(ed, kDetLogLn2Hi), add(mul(ed, kDetLogLn2Lo), log_m));
}

// Histogram bin of a magnitude (not NaN): bins equal-width over [0, bins / scale], everything
// at or beyond the top in the last bin. `scale` is histogram_scale(range_max, bins). The clamp
// runs on the bits (non-negative floats order as integers) to the largest float below `bins`,
// whose integer part is bins - 1: no branch, and no float-to-int conversion out of range.
QF_HD int64_t histogram_bin(float magnitude, float scale, int64_t bins) {
#ifdef __CUDA_ARCH__
  const uint32_t v = __float_as_uint(__fmul_rn(magnitude, scale));
  const uint32_t top = __float_as_uint(static_cast<float>(bins)) - 1;
  return static_cast<int64_t>(__uint_as_float(v < top ? v : top));
#else
  const float product = magnitude * scale;
  const auto top_float = static_cast<float>(bins);
  uint32_t v, top;
  std::memcpy(&v, &product, sizeof v);
  std::memcpy(&top, &top_float, sizeof top);
  top -= 1;
  const uint32_t clamped = v < top ? v : top;
  float f;
  std::memcpy(&f, &clamped, sizeof f);
  return static_cast<int64_t>(f);
#endif
}

// ---- entropy (KL divergence) search; see kernels/calib.h for the method ---------------------

// Per-candidate constants. `kept` bins are kept; `outliers` counts the values beyond them, which
// P folds into bin kept - 1; `last` is that bin's own count.
struct EntropyCandidate {
  double p_total = 0, q_total = 0;  // sum P (all values) and sum Q (values inside)
  bool infinite = false;            // some P_j > 0 has Q_j = 0: the divergence is +inf
};

// The term from the normalised P_j and Q_j (p > 0): P_j (log P_j - log Q_j). The difference of
// logs rather than the log of the ratio, so that the CPU search takes log P_j once per bin and
// log Q_j once per level instead of a logarithm per bin and candidate; it is still exactly 0
// where P_j = Q_j.
QF_HD double entropy_term_normalised(double p, double q) {
  return mul(p, sub(det_log(p), det_log(q)));
}

// The term of bin j: P_j log(P_j / Q_j) on the normalised distributions, 0 where P_j = 0.
// Q_j > 0 wherever P_j > 0 once the candidate is finite.
QF_HD double entropy_term(double p_count, double q_count, const EntropyCandidate& c) {
  if (!(p_count > 0)) return 0.0;
  return entropy_term_normalised(div(p_count, c.p_total), div(q_count, c.q_total));
}

// Q is the histogram's own bins expanded, so it is zero exactly where the histogram is; P differs
// from it only in bin kept - 1, which holds the outliers too. So the divergence is infinite when
// no value lies inside or when the outliers land on a bin of its own empty.
QF_HD EntropyCandidate entropy_candidate(uint64_t total, uint64_t outliers, uint64_t last) {
  EntropyCandidate c;
  if (total == outliers || (outliers > 0 && last == 0)) {
    c.infinite = true;
    return c;
  }
  c.p_total = static_cast<double>(total);
  c.q_total = static_cast<double>(total - outliers);
  return c;
}

// ---- MSE search ----------------------------------------------------------------------------

// Integral of (x - c)^2 over [lo, hi).
QF_HD double squared_error_integral(double lo, double hi, double c) {
  const double u = sub(hi, c);
  const double v = sub(lo, c);
  return div(mul(sub(hi, lo), add(add(mul(u, u), mul(u, v)), mul(v, v))), 3.0);
}

// Expected squared error, in bin widths squared, of a value uniform in bin [j, j + 1) under
// symmetric quantization with threshold `kept` (in bins) and `quant_max` positive levels:
// round to the nearest multiple of the step kept / quant_max below the threshold, clip above.
// The step is at least one bin wide (kept > quant_max), so a bin spans at most two cells.
// A clipped bin's error depends on j - kept alone: with integers below 2^53 every operation of
// squared_error_integral(j, j + 1, kept) is exact up to the final division, and gives the same
// operands as this (the CPU search tabulates it).
QF_HD double mse_clipped_bin_error(int64_t above) {
  const auto lo = static_cast<double>(above);
  return squared_error_integral(lo, add(lo, 1.0), 0.0);
}

QF_HD double mse_bin_error(int64_t j, int64_t kept, int quant_max) {
  const auto lo = static_cast<double>(j);
  const double hi = add(lo, 1.0);
  const auto t = static_cast<double>(kept);
  if (j >= kept) return squared_error_integral(lo, hi, t);
  const double step = div(t, static_cast<double>(quant_max));
  const double k = floor(add(div(lo, step), 0.5));
  const double edge = mul(add(k, 0.5), step);
  if (edge < hi) {
    return add(squared_error_integral(lo, edge, mul(k, step)),
               squared_error_integral(edge, hi, mul(add(k, 1.0), step)));
  }
  return squared_error_integral(lo, hi, mul(k, step));
}

// The CUDA block's reduction of kLanes partial sums, for the host: pairwise, halving.
QF_HD double lane_tree_sum(double* lanes) {
  for (int stride = kLanes / 2; stride > 0; stride >>= 1) {
    for (int t = 0; t < stride; ++t) lanes[t] = add(lanes[t], lanes[t + stride]);
  }
  return lanes[0];
}

}  // namespace qforge::calib_math
