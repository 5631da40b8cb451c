#include "kernels/cpu/erf_cpu.h"

#include <cstring>

namespace qforge {

namespace {

using F4 = float __attribute__((vector_size(16)));
using I4 = int32_t __attribute__((vector_size(16)));

F4 splat(float v) { return F4{v, v, v, v}; }
I4 splat_i(int32_t v) { return I4{v, v, v, v}; }

// mask ? a : b, lane by lane (mask lanes are all ones or all zeros).
F4 select(I4 mask, F4 a, F4 b) {
  return reinterpret_cast<F4>((mask & reinterpret_cast<I4>(a)) | (~mask & reinterpret_cast<I4>(b)));
}

F4 horner(F4 x, const float* c, int n) {  // c[0] x^(n-1) + ... + c[n-1]
  F4 p = splat(c[0]);
  for (int i = 1; i < n; ++i) p = p * x + splat(c[i]);
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
constexpr float kSmallEnd = 0.921875f;
constexpr float kTailEnd = 3.925f;

// exp(q) for q in [-18, 0]: q = n ln2 + r with |r| <= ln2/2, e^r by its Taylor series to r^6
// (error below 2e-8 relative there), 2^n from the exponent bits.
F4 exp_negative(F4 q) {
  const F4 round = splat(12582912.0f);  // 1.5 * 2^23: adding it rounds to an integer
  const F4 nf = (q * splat(1.44269504088896341f) + round) - round;
  const F4 r = (q - nf * splat(0.693145751953125f)) - nf * splat(1.428606765330187e-06f);
  constexpr float kExp[] = {1.0f / 720, 1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f};
  const F4 e = horner(r, kExp, 7);
  const I4 n = __builtin_convertvector(nf, I4);
  return e * reinterpret_cast<F4>((n + splat_i(127)) << 23);
}

F4 erf4(F4 x) {
  const I4 bits = reinterpret_cast<I4>(x);
  const I4 sign = bits & splat_i(INT32_MIN);
  const F4 ax = reinterpret_cast<F4>(bits & splat_i(INT32_MAX));
  const F4 small = ax * horner(ax * ax, kSmall, 7);
  const I4 below_end = ax < splat(kTailEnd);
  const F4 xc = select(below_end, ax, splat(kTailEnd));
  const F4 large = select(below_end, splat(1.0f) - exp_negative(horner(xc, kTail, 9)), splat(1.0f));
  F4 mag = select(ax < splat(kSmallEnd), small, large);
  mag = select(ax != ax, ax, mag);  // NaN stays NaN
  return reinterpret_cast<F4>(reinterpret_cast<I4>(mag) | sign);
}

F4 gelu4(F4 x) {
  return splat(0.5f) * x * (splat(1.0f) + erf4(x * splat(0.70710678118654752f)));
}

template <F4 (*Kernel)(F4)>
void map4(const float* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    F4 v;
    std::memcpy(&v, x + i, sizeof v);
    v = Kernel(v);
    std::memcpy(y + i, &v, sizeof v);
  }
  if (i < n) {  // the tail through the same lanes
    F4 v = splat(0.0f);
    std::memcpy(&v, x + i, static_cast<size_t>(n - i) * sizeof(float));
    v = Kernel(v);
    std::memcpy(y + i, &v, static_cast<size_t>(n - i) * sizeof(float));
  }
}

}  // namespace

void erf_f32(const float* x, float* y, int64_t n) { map4<erf4>(x, y, n); }

float erf_f32(float x) {
  float y = 0;
  map4<erf4>(&x, &y, 1);
  return y;
}

void gelu_erf_f32(const float* x, float* y, int64_t n) { map4<gelu4>(x, y, n); }

}  // namespace qforge
