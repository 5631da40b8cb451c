#include "kernels/cpu/vmath_cpu.h"

#include <cstring>

#include "kernels/cpu/lanes.h"

namespace qforge {

namespace {

using lanes::select;
using lanes::splat;

// Lanes of W floats (F) and of W int32 for the bit work (I); every helper is inlined into the
// entry point, so in the AVX2 entry the same code runs eight lanes wide (16 in the AVX-512 one).
template <int W>
struct Lanes {
  using F = typename lanes::Lanes<float, W>::V;
  using I = typename lanes::Lanes<float, W>::M;
};

#define QF_INLINE QF_LANES_INLINE

template <typename F, size_t N>
QF_INLINE F horner(F x, const float (&c)[N]) {  // c[0] x^(N-1) + ... + c[N-1]
  F p = splat<F>(c[0]);
  for (size_t i = 1; i < N; ++i) p = p * x + splat<F>(c[i]);
  return p;
}

// erf(x)/x = P(x^2) on |x| < 0.921875: a least-squares fit in relative error (1.7e-10) on
// Chebyshev nodes, highest power first.
constexpr float kSmall[] = {8.411063754465431e-05f, -0.0008153790840879083f,
                            0.005202176980674267f,  -0.026859957724809647f,
                            0.11283708363771439f,   -0.37612634897232056f,
                            1.128379225730896f};
// log(erfc(x)) = Q(x) on 0.921875 <= x <= 3.925 (fit error 8.8e-9); above 3.925 erf(x)
// rounds to 1 in f32.
constexpr float kTail[] = {1.6355552883151603e-06f, -4.599288505080512e-05f,
                           0.0005959702245123127f,  -0.004754332736126084f,
                           0.02640233364248024f,    -0.11004021618775735f,
                           -0.6318755802247192f,    -1.1302002757719747f,
                           0.0003109433747121685f};
constexpr float kExp[] = {1.0f / 720, 1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f};
// Range reduction of exp: n = round(q / ln2) (adding 1.5 * 2^23 rounds to an integer), then
// r = q - n ln2 with ln2 split in two so that n * kLn2Hi is exact.
constexpr float kRoundToInt = 12582912.0f;
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693145751953125f;
constexpr float kLn2Lo = 1.428606765330187e-06f;
constexpr float kSmallEnd = 0.921875f;
constexpr float kTailEnd = 3.925f;

// exp(q) for q in [-18, 0]: q = n ln2 + r with |r| <= ln2/2, e^r by its Taylor series to r^6
// (error below 2e-8 relative there), 2^n from the exponent bits.
template <int W>
QF_INLINE typename Lanes<W>::F exp_negative(typename Lanes<W>::F q) {
  using F = typename Lanes<W>::F;
  using I = typename Lanes<W>::I;
  const F round = splat<F>(kRoundToInt);
  const F nf = (q * splat<F>(kLog2e) + round) - round;
  const F r = (q - nf * splat<F>(kLn2Hi)) - nf * splat<F>(kLn2Lo);
  const I n = __builtin_convertvector(nf, I);
  return horner(r, kExp) * reinterpret_cast<F>((n + splat<I>(127)) << 23);
}

template <int W>
QF_INLINE typename Lanes<W>::F erf_lanes(typename Lanes<W>::F x) {
  using F = typename Lanes<W>::F;
  using I = typename Lanes<W>::I;
  const I bits = reinterpret_cast<I>(x);
  const I sign = bits & splat<I>(INT32_MIN);
  const F ax = reinterpret_cast<F>(bits & splat<I>(INT32_MAX));
  const F small = ax * horner(ax * ax, kSmall);
  const I below_end = ax < splat<F>(kTailEnd);
  const F xc = select(below_end, ax, splat<F>(kTailEnd));
  const F one = splat<F>(1.0f);
  const F large = select(below_end, one - exp_negative<W>(horner(xc, kTail)), one);
  F mag = select(ax < splat<F>(kSmallEnd), small, large);
  mag = select(ax != ax, ax, mag);  // NaN stays NaN
  return reinterpret_cast<F>(reinterpret_cast<I>(mag) | sign);
}

template <int W>
QF_INLINE typename Lanes<W>::F gelu_lanes(typename Lanes<W>::F x) {
  using F = typename Lanes<W>::F;
  return splat<F>(0.5f) * x * (splat<F>(1.0f) + erf_lanes<W>(x * splat<F>(0.70710678118654752f)));
}

// exp(q) over the whole f32 range: q = n ln2 + r with |r| <= ln2/2, e^r by its Taylor series
// to r^7 (truncation below 6e-9 relative), 2^n as two factors 2^(n/2) 2^(n - n/2) so that
// subnormal results and overflow come out of the multiplications (n is clamped to [-152,
// 130] first, which keeps both factors normal); q below -104 (e^q < 2^-150) gives 0, NaN stays.
template <int W>
QF_INLINE typename Lanes<W>::F exp_lanes(typename Lanes<W>::F q) {
  using F = typename Lanes<W>::F;
  using I = typename Lanes<W>::I;
  const F round = splat<F>(kRoundToInt);
  F nf = (q * splat<F>(kLog2e) + round) - round;
  nf = select(nf < splat<F>(-152.0f), splat<F>(-152.0f), nf);
  nf = select(nf > splat<F>(130.0f), splat<F>(130.0f), nf);
  nf = select(nf != nf, splat<F>(0.0f), nf);  // NaN: any n, the result is NaN anyway
  const F r = (q - nf * splat<F>(kLn2Hi)) - nf * splat<F>(kLn2Lo);
  constexpr float kExp7[] = {1.0f / 5040, 1.0f / 720, 1.0f / 120, 1.0f / 24,
                             1.0f / 6,    0.5f,       1.0f,       1.0f};
  const F e = horner(r, kExp7);
  const I n = __builtin_convertvector(nf, I);
  const I half = n >> 1;  // floor(n / 2)
  const F s1 = reinterpret_cast<F>((half + splat<I>(127)) << 23);
  const F s2 = reinterpret_cast<F>((n - half + splat<I>(127)) << 23);
  const F y = (e * s1) * s2;
  return select(q < splat<F>(-104.0f), splat<F>(0.0f), y);
}

template <int W>
QF_INLINE typename Lanes<W>::F sigmoid_lanes(typename Lanes<W>::F x) {
  using F = typename Lanes<W>::F;
  using I = typename Lanes<W>::I;
  const F ax = reinterpret_cast<F>(reinterpret_cast<I>(x) & splat<I>(INT32_MAX));
  const F e = exp_lanes<W>(-ax);
  const F d = splat<F>(1.0f) + e;
  return select(x < splat<F>(0.0f), e / d, splat<F>(1.0f) / d);
}

enum class Fn { Erf, Gelu, Sigmoid, ExpShifted };

// `shift` is ExpShifted's (exp(v - shift)); the others ignore it.
template <int W, Fn fn>
QF_INLINE typename Lanes<W>::F apply(typename Lanes<W>::F v, typename Lanes<W>::F shift) {
  if constexpr (fn == Fn::Erf) {
    return erf_lanes<W>(v);
  } else if constexpr (fn == Fn::Gelu) {
    return gelu_lanes<W>(v);
  } else if constexpr (fn == Fn::Sigmoid) {
    return sigmoid_lanes<W>(v);
  } else {
    return exp_lanes<W>(v - shift);
  }
}

// No lambdas here: a lambda would not inherit the AVX2 or AVX-512 entry's target, and a wide
// value passed to it would cross a call with another ABI.
template <int W, Fn fn>
QF_INLINE void map_lanes(const float* x, float* y, int64_t n, float shift) {
  using F = typename Lanes<W>::F;
  const F s = splat<F>(shift);
  int64_t i = 0;
  for (; i + W <= n; i += W) {
    F v;
    std::memcpy(&v, x + i, sizeof v);
    v = apply<W, fn>(v, s);
    std::memcpy(y + i, &v, sizeof v);
  }
  if (i < n) {  // the tail through the same lanes; the unused ones compute on `shift`
    F v = s;
    std::memcpy(&v, x + i, static_cast<size_t>(n - i) * sizeof(float));
    v = apply<W, fn>(v, s);
    std::memcpy(y + i, &v, static_cast<size_t>(n - i) * sizeof(float));
  }
}

#undef QF_INLINE

template <Fn fn>
void map_sse2(const float* x, float* y, int64_t n, float shift) {
  map_lanes<4, fn>(x, y, n, shift);
}

#if defined(__x86_64__)
template <Fn fn>
__attribute__((target("avx2"))) void map_avx2(const float* x, float* y, int64_t n, float shift) {
  map_lanes<8, fn>(x, y, n, shift);
}

template <Fn fn>
__attribute__((target("avx512f"))) void map_avx512(const float* x, float* y, int64_t n,
                                                   float shift) {
  map_lanes<16, fn>(x, y, n, shift);
}
#endif

template <Fn fn>
void map(const float* x, float* y, int64_t n, VmathLanes lanes, float shift = 0.0f) {
#if defined(__x86_64__)
  if (lanes == VmathLanes::Auto && lanes::cpu_has_avx512f()) {
    return map_avx512<fn>(x, y, n, shift);
  }
  if (lanes != VmathLanes::Four && lanes::cpu_has_avx2()) return map_avx2<fn>(x, y, n, shift);
#endif
  (void)lanes;
  map_sse2<fn>(x, y, n, shift);
}

}  // namespace

void erf_f32(const float* x, float* y, int64_t n, VmathLanes lanes) {
  map<Fn::Erf>(x, y, n, lanes);
}

float erf_f32(float x) {
  float y = 0;
  map<Fn::Erf>(&x, &y, 1, VmathLanes::Four);
  return y;
}

void gelu_erf_f32(const float* x, float* y, int64_t n, VmathLanes lanes) {
  map<Fn::Gelu>(x, y, n, lanes);
}

void sigmoid_f32(const float* x, float* y, int64_t n, VmathLanes lanes) {
  map<Fn::Sigmoid>(x, y, n, lanes);
}

void exp_shifted_f32(const float* x, float* y, int64_t n, float shift, VmathLanes lanes) {
  map<Fn::ExpShifted>(x, y, n, lanes, shift);
}

}  // namespace qforge
