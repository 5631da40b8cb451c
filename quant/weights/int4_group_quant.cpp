#include "quant/weights/int4_group_quant.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstring>
#include <vector>

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#include <immintrin.h>
#endif

#include "ir/error.h"
#include "ir/half.h"
#include "kernels/cpu/task_pool.h"
#include "kernels/device.h"
#include "kernels/int4_math.h"

// The lane helpers are forced inline so that each ISA build of the chunk steps compiles them for
// its own vectors (as kernels/cpu/int4_matmul_cpu.cpp does). The generic builds use no FMA
// (-ffp-contract=off and no "fma" target); the AVX2 and AVX-512 steps fuse only where the
// product is exact, and screen only where choose_candidates' bound allows for it. Every
// operation is an IEEE one on one lane, so all builds give the same bits.
#define QF_INLINE inline __attribute__((always_inline))

namespace qforge {

namespace {

namespace m4 = int4_math;

constexpr int64_t kLanes = kInt4GroupLanes;
constexpr int kMagnitudes = m4::kMagnitudeCount;  // candidate k < kMagnitudes: +magnitude k
constexpr int kCandidates = m4::kScaleCandidates;  // k >= kMagnitudes: -magnitude (k - 11)
constexpr int64_t kParallelMin = 65536;            // elements below which one thread runs
constexpr uint16_t kBf16MinSubnormal = 0x0001;

static_assert(kCandidates == 2 * kMagnitudes - 1, "one negative candidate per magnitude >= 1");

// round_half_even(clamp(w / s, -8, 8)): int4_math::quantize_one before its final clamp to 7, so
// that the negative scale's code is min(-r, 7) from the same division. For finite w and a
// finite nonzero s, as everywhere here (a chunk holding NaN or Inf is reported, not searched,
// and a stored scale is never 0), so w / s is never NaN and quantize_one's NaN branch goes.
QF_INLINE int32_t rounded(float w, float s) {
  const auto bits = std::bit_cast<int32_t>(w / s);
  const int32_t magnitude = std::min(bits & 0x7fffffff, m4::kBits8);
  const auto v = std::bit_cast<float>((bits & INT32_MIN) | magnitude);
  return static_cast<int32_t>((v + m4::kRoundMagic) - m4::kRoundMagic);
}

QF_INLINE float code_of(int32_t r) { return static_cast<float>(r > 7 ? 7 : r); }

// Phase 1 of the search, a screen: each candidate's error with the exact search's codes and
// terms (q = rounded(w, s), e = w - s q, as int4_math::accumulate_fit), summed in float instead
// of double. Rows in order; with Negative, the sums for -s (ns) go to fn as well.
template <bool Negative, int64_t W>
QF_INLINE void screen_pair(const float* tile, int64_t bs, const float* s, const float* ns,
                           float* fp, float* fn) {
  for (int64_t h = 0; h < kLanes; h += W) {  // W lanes at a time: the sums stay in registers
    float a[W] = {}, b[W] = {};
    for (int64_t r = 0; r < bs; ++r) {
      const float* w = tile + r * kLanes + h;
      for (int64_t j = 0; j < W; ++j) {
        const int32_t q = rounded(w[j], s[h + j]);
        const float e = w[j] - s[h + j] * code_of(q);
        a[j] += e * e;
        if constexpr (Negative) {
          const float en1 = w[j] - ns[h + j] * code_of(-q);
          b[j] += en1 * en1;
        }
      }
    }
    std::memcpy(fp + h, a, sizeof a);
    if constexpr (Negative) std::memcpy(fn + h, b, sizeof b);
  }
}

// Lane j's exact error for scale s: int4_math::accumulate_fit's error term over the rows in
// order (the reference's division and double sum).
double exact_error(const float* tile, int64_t bs, int64_t j, float s) {
  double err = 0.0;
  for (int64_t r = 0; r < bs; ++r) {
    const float w = tile[r * kLanes + j];
    const auto q = static_cast<float>(m4::quantize_one(w, s));
    const float e = w - s * q;
    err += static_cast<double>(e) * static_cast<double>(e);
  }
  return err;
}

// int4_math::accumulate_fit over the tile's rows in order: error, sum w q, sum q q.
template <int64_t W>
QF_INLINE void fit_full(const float* tile, int64_t bs, const float* s, double* err, double* wq,
                        double* qq) {
  for (int64_t h = 0; h < kLanes; h += W) {
    double a[W] = {}, b[W] = {};
    int32_t c[W] = {};  // sum q^2 is an integer below 2^31: the double sum's value, exactly
    for (int64_t r = 0; r < bs; ++r) {
      const float* w = tile + r * kLanes + h;
      for (int64_t j = 0; j < W; ++j) {
        const int32_t qi = std::min(rounded(w[j], s[h + j]), 7);
        const auto q = static_cast<float>(qi);
        const float e = w[j] - s[h + j] * q;
        a[j] += static_cast<double>(e) * static_cast<double>(e);
        b[j] += static_cast<double>(w[j]) * static_cast<double>(q);
        c[j] += qi * qi;
      }
    }
    std::memcpy(err + h, a, sizeof a);
    std::memcpy(wq + h, b, sizeof b);
    for (int64_t j = 0; j < W; ++j) qq[h + j] = static_cast<double>(c[j]);
  }
}

QF_INLINE void f16_lanes(const uint16_t* bits, float* out) {
  for (int64_t j = 0; j < kLanes; ++j) out[j] = f16_to_f32(bits[j]);
}

// The exact fit of one scale per lane (fit_full's sums), as a plain function per ISA, so that
// the refinement below can be shared.
using FitStep = void (*)(const float*, int64_t, const float*, double*, double*, double*);

// Phase 2 of the search, per lane: the exact search's winner (least double error, ties to the
// earlier candidate) is among the candidates whose screen cannot be shown larger than another's.
// A recursive float sum of n terms, each a rounded product or a fused multiply-add, is within
// gamma = (n + 1) u / (1 - (n + 1) u) of the exact sum, relative (u = 2^-24), plus
// sigma = (n + 1) 2^-149 for subnormal results, in any order of addition. A screen whose codes
// may differ from the division's is further within a factor rho of the exact terms (1 where
// the screen divides; see screen_avx512 where it does not). So the exact error E_k lies in
// [(S_k - sigma) / (rho (1 + gamma)), rho (S_k + sigma) / (1 - gamma)], and a candidate whose
// lower end exceeds the least screen's upper end, widened by 1 + 2^-20 for the double sums' own
// rounding (at most n 2^-53 relative), loses: it survives when
// S_k <= (S_least + sigma) rho^2 (1 + 2^-20) (1 + gamma) / (1 - gamma) + sigma,
// evaluated in double (a few more roundings of 2^-53, far inside the margin). One candidate
// left wins; with more, each is evaluated exactly (one whose bits repeat an earlier one's has
// its error and loses the tie): 1.7% of the groups of bench/bench_export.py's bf16 weights. A
// screen that overflowed, or a group too long for the bound, keeps all.
struct ScreenBound {
  bool usable = false;  // false: every candidate survives
  double factor = 0.0, sigma = 0.0;
};

ScreenBound screen_bound(int64_t bs, double rho) {
  const double nu = static_cast<double>(bs + 1) * 0x1p-24;
  ScreenBound b;
  b.usable = nu < 1e-2;
  const double gamma = nu / (1.0 - nu);
  b.factor = rho * rho * (1.0 + 0x1p-20) * (1.0 + gamma) / (1.0 - gamma);
  b.sigma = static_cast<double>(bs + 1) * 0x1p-149;
  return b;
}

// Lane j's winner among the candidates in `survivors` (bit k: candidate k), by exact error.
int exact_pick(const float* tile, int64_t bs, int64_t j, const uint16_t (*cand)[kLanes],
               uint32_t survivors) {
  double least_exact = 0.0;
  uint16_t seen[kCandidates];
  int seen_count = 0, pick = 0;
  for (int k = 0; k < kCandidates; ++k) {
    if (((survivors >> k) & 1) == 0) continue;
    if (std::find(seen, seen + seen_count, cand[k][j]) != seen + seen_count) continue;
    seen[seen_count++] = cand[k][j];
    const double err = exact_error(tile, bs, j, f16_to_f32(cand[k][j]));
    if (seen_count == 1 || err < least_exact) {
      least_exact = err;
      pick = k;
    }
  }
  return pick;
}

// The candidates' screens to each lane's fp16 bits `sb`.
void choose_candidates(const float* tile, int64_t bs, const float* amax,
                       const uint16_t (*cand)[kLanes], const float (*screen)[kLanes],
                       const ScreenBound& bound, uint16_t* sb) {
  for (int64_t j = 0; j < kLanes; ++j) {
    if (amax[j] == 0.0f) {
      sb[j] = cand[0][j];
      continue;
    }
    float least = screen[0][j];
    for (int k = 1; k < kCandidates; ++k) least = std::min(least, screen[k][j]);
    const bool bounded = bound.usable && least < 0x1p126f;
    const double limit = (static_cast<double>(least) + bound.sigma) * bound.factor + bound.sigma;
    uint32_t survivors = 0;
    for (int k = 0; k < kCandidates; ++k) {
      if (!bounded || static_cast<double>(screen[k][j]) <= limit) survivors |= uint32_t{1} << k;
    }
    const int pick = std::has_single_bit(survivors) ? std::countr_zero(survivors)
                                                    : exact_pick(tile, bs, j, cand, survivors);
    sb[j] = cand[pick][j];
  }
}

// After the candidates: up to kRefineRounds least-squares refinements of each lane's scale
// `sb`, each kept only when strictly better (kernels/cpu/int4_cpu.cpp's order).
void refine_lanes(const float* tile, int64_t bs, FitStep fit, uint16_t* sb) {
  alignas(64) double best[kLanes], wq[kLanes], qq[kLanes], e[kLanes], cwq[kLanes], cqq[kLanes];
  alignas(64) float s[kLanes];
  for (int64_t j = 0; j < kLanes; ++j) s[j] = f16_to_f32(sb[j]);
  fit(tile, bs, s, best, wq, qq);  // the chosen candidate's sums: its exact evaluation
  bool refining[kLanes];
  std::fill(refining, refining + kLanes, true);
  for (int round = 0; round < m4::kRefineRounds; ++round) {
    bool any = false;
    alignas(64) uint16_t next[kLanes];
    for (int64_t j = 0; j < kLanes; ++j) {
      const uint16_t n = m4::refined_scale_bits(wq[j], qq[j]);
      if (n == 0 || n == sb[j]) refining[j] = false;
      next[j] = refining[j] ? n : sb[j];
      any = any || refining[j];
    }
    if (!any) break;
    for (int64_t j = 0; j < kLanes; ++j) s[j] = f16_to_f32(next[j]);
    fit(tile, bs, s, e, cwq, cqq);
    for (int64_t j = 0; j < kLanes; ++j) {
      if (!refining[j]) continue;
      if (!(e[j] < best[j])) {
        refining[j] = false;
        continue;
      }
      best[j] = e[j];
      wq[j] = cwq[j];
      qq[j] = cqq[j];
      sb[j] = next[j];
    }
  }
}

// kernels/cpu/int4_cpu.cpp's search for each lane (group): the candidates in order, the first
// strictly smallest error kept, then the refinements. `amax` finite; `sb` receives the fp16
// scale bits. The screen divides once per element and magnitude: exact codes.
template <int64_t W>
QF_INLINE void search_lanes(const float* tile, int64_t bs, const float* amax, FitStep fit,
                            uint16_t* sb) {
  alignas(64) uint16_t cand[kCandidates][kLanes];
  for (int k = 0; k < kCandidates; ++k)
    for (int64_t j = 0; j < kLanes; ++j) cand[k][j] = m4::candidate_scale_bits(amax[j], k);
  alignas(64) float screen[kCandidates][kLanes];
  alignas(64) float s[kLanes], ns[kLanes];
  f16_lanes(cand[0], s);
  screen_pair<false, W>(tile, bs, s, s, screen[0], nullptr);
  // Magnitude m's negative candidate is -s (its bits are s's with the sign set), except where
  // amax is 0: every candidate is then 1.0 and every error 0 (all values are +-0), whatever
  // the codes; such a lane keeps candidate 0.
  for (int mag = 1; mag < kMagnitudes; ++mag) {
    f16_lanes(cand[mag], s);
    f16_lanes(cand[mag + kMagnitudes - 1], ns);
    screen_pair<true, W>(tile, bs, s, ns, screen[mag], screen[mag + kMagnitudes - 1]);
  }
  choose_candidates(tile, bs, amax, cand, screen, screen_bound(bs, 1.0), sb);
  refine_lanes(tile, bs, fit, sb);
}

// Codes from the stored scales sf (transposed like the tile, as int8 in [-8, 7]) and each lane's
// error figures in element order: max |w - q s|, sum w^2, sum (w - q s)^2, in double.
QF_INLINE void codes_lanes(const float* tile, int64_t bs, const float* sf, int8_t* codes,
                           double* max_abs, double* signal, double* noise) {
  double m[kLanes] = {}, sg[kLanes] = {}, ns[kLanes] = {};
  for (int64_t r = 0; r < bs; ++r) {
    const float* w = tile + r * kLanes;
    int8_t* c = codes + r * kLanes;
    for (int64_t j = 0; j < kLanes; ++j) {
      const int32_t q = std::min(rounded(w[j], sf[j]), 7);
      c[j] = static_cast<int8_t>(q);
      const float deq = static_cast<float>(q) * sf[j];
      const double e = static_cast<double>(w[j]) - static_cast<double>(deq);
      m[j] = std::max(m[j], std::abs(e));
      sg[j] += static_cast<double>(w[j]) * w[j];
      ns[j] += e * e;
    }
  }
  std::memcpy(max_abs, m, sizeof m);
  std::memcpy(signal, sg, sizeof sg);
  std::memcpy(noise, ns, sizeof ns);
}

// Element i of the weight's bytes as f32.
template <DType D>
float load(const std::byte* p, int64_t i) {
  if constexpr (D == DType::F32) {
    float v;
    std::memcpy(&v, p + 4 * i, 4);
    return v;
  } else {
    uint16_t h;
    std::memcpy(&h, p + 2 * i, 2);
    return D == DType::BF16 ? bf16_to_f32(h) : f16_to_f32(h);
  }
}

// The tile [bs][kLanes] of groups first .. first + groups (zero lanes past them).
template <DType D>
void fill_tile(const std::byte* w, int64_t first, int64_t groups, int64_t bs, float* tile) {
  for (int64_t j = 0; j < groups; ++j) {
    const int64_t e0 = (first + j) * bs;
    for (int64_t r = 0; r < bs; ++r) tile[r * kLanes + j] = load<D>(w, e0 + r);
  }
  for (int64_t j = groups; j < kLanes; ++j)
    for (int64_t r = 0; r < bs; ++r) tile[r * kLanes + j] = 0.0f;
}

void fill_generic(const std::byte* w, DType dtype, int64_t first, int64_t groups, int64_t bs,
                  float* tile) {
  switch (dtype) {
    case DType::BF16: fill_tile<DType::BF16>(w, first, groups, bs, tile); break;
    case DType::F16: fill_tile<DType::F16>(w, first, groups, bs, tile); break;
    default: fill_tile<DType::F32>(w, first, groups, bs, tile); break;
  }
}

// The codes [bs][kLanes] of `count` groups back to element order (group j's value r is element
// j * bs + r of the chunk), then two codes a byte into `out`. A chunk holds kLanes * bs
// elements, an even count, so it starts on a whole byte; a last odd element takes a padding
// lane's code, 0, as its high nibble (an odd count is short of kLanes * bs). `natural` holds
// kLanes * bs codes.
void pack_chunk(const int8_t* codes, int64_t bs, int64_t count, int8_t* natural, uint8_t* out) {
  for (int64_t j = 0; j < count; ++j) {
    int8_t* to = natural + j * bs;
    for (int64_t r = 0; r < bs; ++r) to[r] = codes[r * kLanes + j];
  }
  const int64_t elems = count * bs;
  if (elems % 2 != 0) natural[elems] = 0;
  for (int64_t i = 0; i < (elems + 1) / 2; ++i) {
    out[i] =
        static_cast<uint8_t>(m4::nibble(natural[2 * i]) | (m4::nibble(natural[2 * i + 1]) << 4));
  }
}

// The chunk steps of one ISA. fill and pack may be null, or return false, where the generic
// fill_tile and pack_chunk serve.
struct LaneSteps {
  void (*search)(const float*, int64_t, const float*, uint16_t*);
  void (*codes)(const float*, int64_t, const float*, int8_t*, double*, double*, double*);
  bool (*fill)(const std::byte*, DType, int64_t, int64_t, int64_t, float*) = nullptr;
  bool (*pack)(const int8_t*, int64_t, int64_t, uint8_t*) = nullptr;
};

void fit_base(const float* t, int64_t bs, const float* s, double* e, double* wq, double* qq) {
  fit_full<4>(t, bs, s, e, wq, qq);
}
void search_base(const float* t, int64_t bs, const float* a, uint16_t* sb) {
  search_lanes<4>(t, bs, a, fit_base, sb);
}
void codes_base(const float* t, int64_t bs, const float* sf, int8_t* c, double* m, double* s,
                double* n) {
  codes_lanes(t, bs, sf, c, m, s, n);
}

#if defined(__x86_64__) && defined(__GNUC__)
#define QF_AVX2 __attribute__((target("avx2,fma,f16c")))
#if defined(__clang__)
#define QF_AVX512 __attribute__((target("avx512f,avx512vl,avx512dq,avx512bw")))
#else
#define QF_AVX512 \
  __attribute__((target("avx512f,avx512vl,avx512dq,avx512bw,prefer-vector-width=512")))
#endif
// An 8 x 8 transpose of 16-bit values: x[i] holds row i, x[c] receives column c.
QF_INLINE void transpose8x16(__m128i* x) {
  __m128i a[8], b[8];
  for (int p = 0; p < 4; ++p) {  // a[2p + h]: columns 4h .. 4h + 3 of rows 2p, 2p + 1
    a[2 * p] = _mm_unpacklo_epi16(x[2 * p], x[2 * p + 1]);
    a[2 * p + 1] = _mm_unpackhi_epi16(x[2 * p], x[2 * p + 1]);
  }
  for (int q = 0; q < 2; ++q) {  // b[4q + c]: columns 2c, 2c + 1 of rows 4q .. 4q + 3
    for (int h = 0; h < 2; ++h) {
      b[4 * q + 2 * h] = _mm_unpacklo_epi32(a[4 * q + h], a[4 * q + 2 + h]);
      b[4 * q + 2 * h + 1] = _mm_unpackhi_epi32(a[4 * q + h], a[4 * q + 2 + h]);
    }
  }
  for (int c = 0; c < 4; ++c) {
    x[2 * c] = _mm_unpacklo_epi64(b[c], b[4 + c]);
    x[2 * c + 1] = _mm_unpackhi_epi64(b[c], b[4 + c]);
  }
}

// Byte i of the 16 groups: the codes of rows 2i and 2i + 1 as low and high nibbles.
QF_INLINE __m128i byte_row(const int8_t* codes, int64_t i) {
  const __m128i low = _mm_set1_epi8(0x0f);
  const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + 2 * i * kLanes));
  const __m128i b =
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + (2 * i + 1) * kLanes));
  return _mm_or_si128(_mm_and_si128(a, low), _mm_andnot_si128(low, _mm_slli_epi16(b, 4)));
}

// pack_chunk for an even group size, in SSE2 (every x86-64 CPU): rows 2i and 2i + 1 make byte
// i of each group (low nibble first), and 16 x 16 blocks of (byte, group) are transposed in
// registers.
bool pack_sse2(const int8_t* codes, int64_t bs, int64_t count, uint8_t* out) {
  if (bs % 2 != 0) return false;
  const int64_t bytes = bs / 2;  // per group
  int64_t i0 = 0;
  for (; i0 + 16 <= bytes; i0 += 16) {
    __m128i x[16], s1[16], s2[16], s3[16];
    for (int i = 0; i < 16; ++i) x[i] = byte_row(codes, i0 + i);
    for (int p = 0; p < 8; ++p) {  // s1[2p + h]: groups 8h .. 8h + 7 of bytes 2p, 2p + 1
      s1[2 * p] = _mm_unpacklo_epi8(x[2 * p], x[2 * p + 1]);
      s1[2 * p + 1] = _mm_unpackhi_epi8(x[2 * p], x[2 * p + 1]);
    }
    for (int q = 0; q < 4; ++q) {  // s2[4q + c]: groups 4c .. 4c + 3 of bytes 4q .. 4q + 3
      for (int h = 0; h < 2; ++h) {
        s2[4 * q + 2 * h] = _mm_unpacklo_epi16(s1[4 * q + h], s1[4 * q + 2 + h]);
        s2[4 * q + 2 * h + 1] = _mm_unpackhi_epi16(s1[4 * q + h], s1[4 * q + 2 + h]);
      }
    }
    for (int o = 0; o < 2; ++o) {  // s3[8o + c]: groups 2c, 2c + 1 of bytes 8o .. 8o + 7
      for (int c = 0; c < 4; ++c) {
        s3[8 * o + 2 * c] = _mm_unpacklo_epi32(s2[8 * o + c], s2[8 * o + 4 + c]);
        s3[8 * o + 2 * c + 1] = _mm_unpackhi_epi32(s2[8 * o + c], s2[8 * o + 4 + c]);
      }
    }
    for (int c = 0; c < 8; ++c) {  // group 2c and 2c + 1: bytes i0 .. i0 + 15
      const __m128i g0 = _mm_unpacklo_epi64(s3[c], s3[8 + c]);
      const __m128i g1 = _mm_unpackhi_epi64(s3[c], s3[8 + c]);
      if (2 * c < count) {
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 2 * c * bytes + i0), g0);
      }
      if (2 * c + 1 < count) {
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out + (2 * c + 1) * bytes + i0), g1);
      }
    }
  }
  for (int64_t j = 0; j < count; ++j) {
    for (int64_t i = i0; i < bytes; ++i) {
      out[j * bytes + i] = static_cast<uint8_t>(m4::nibble(codes[2 * i * kLanes + j]) |
                                                (m4::nibble(codes[(2 * i + 1) * kLanes + j]) << 4));
    }
  }
  return true;
}
// fill_tile for 16-bit weights: 8 x 8 blocks of (group, value) transposed in registers, then
// `widen(row, low, high)` stores one row of the tile exactly as f32 (low: groups 0-7, high:
// groups 8-15; bf16: the bits shifted up; f16: the IEEE conversion, as f16_to_f32).
template <typename Widen>
QF_INLINE void fill_16bit(const std::byte* w, bool bf16, int64_t first, int64_t groups,
                          int64_t bs, float* tile, Widen widen) {
  int64_t r0 = 0;
  for (; r0 + 8 <= bs; r0 += 8) {
    __m128i half[2][8];
    for (int h = 0; h < 2; ++h) {
      for (int i = 0; i < 8; ++i) {
        const int64_t j = 8 * h + i;
        half[h][i] = j < groups ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(
                                      w + 2 * ((first + j) * bs + r0)))
                                : _mm_setzero_si128();
      }
      transpose8x16(half[h]);
    }
    for (int r = 0; r < 8; ++r) widen(tile + (r0 + r) * kLanes, half[0][r], half[1][r]);
  }
  for (int64_t j = 0; j < kLanes; ++j) {
    for (int64_t r = r0; r < bs; ++r) {
      const int64_t e = (first + j) * bs + r;
      tile[r * kLanes + j] = j >= groups ? 0.0f : bf16 ? load<DType::BF16>(w, e)
                                                         : load<DType::F16>(w, e);
    }
  }
}

// bf16 on SSE2: zeros interleaved below each value are its f32 bits.
bool fill_sse2(const std::byte* w, DType dtype, int64_t first, int64_t groups, int64_t bs,
               float* tile) {
  if (dtype != DType::BF16) return false;
  fill_16bit(w, true, first, groups, bs, tile, [](float* row, __m128i low, __m128i high) {
    const __m128i zero = _mm_setzero_si128();
    _mm_storeu_si128(reinterpret_cast<__m128i*>(row), _mm_unpacklo_epi16(zero, low));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(row + 4), _mm_unpackhi_epi16(zero, low));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(row + 8), _mm_unpacklo_epi16(zero, high));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(row + 12), _mm_unpackhi_epi16(zero, high));
  });
  return true;
}

// fill_16bit on AVX2 (bf16; f16 through F16C).
QF_AVX2 bool fill_avx2(const std::byte* w, DType dtype, int64_t first, int64_t groups,
                       int64_t bs, float* tile) {
  if (dtype != DType::BF16 && dtype != DType::F16) return false;
  const bool bf16 = dtype == DType::BF16;
  const auto widen = [bf16](float* row, __m128i low, __m128i high) QF_AVX2 {
    const auto widen8 = [bf16](__m128i v) QF_AVX2 {
      return bf16 ? _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16))
                  : _mm256_cvtph_ps(v);
    };
    _mm256_storeu_ps(row, widen8(low));
    _mm256_storeu_ps(row + 8, widen8(high));
  };
  fill_16bit(w, bf16, first, groups, bs, tile, widen);
  return true;
}

// Round to nearest, ties to even, without raising exceptions (_mm*_round_ps, vcvtps2ph).
constexpr int kRoundNearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;

QF_AVX2 void fit_avx2(const float* t, int64_t bs, const float* s, double* e, double* wq,
                      double* qq) {
  fit_full<8>(t, bs, s, e, wq, qq);
}
// candidates_avx512 on 8 lanes at a time (the same multiply, division, conversion and edge
// cases): every candidate's bits and each magnitude's positive scale.
QF_AVX2 QF_INLINE void candidates_avx2(const float* amax, uint16_t (*cand)[kLanes],
                                       float (*scale)[kLanes]) {
  const __m128i one = _mm_set1_epi16(static_cast<int16_t>(m4::kF16One));
  const __m128i sign = _mm_set1_epi16(static_cast<int16_t>(m4::kF16SignBit));
  for (int64_t h = 0; h < kLanes; h += 8) {
    const __m256 a = _mm256_loadu_ps(amax + h);
    const __m256i zero32 = _mm256_castps_si256(_mm256_cmp_ps(a, _mm256_setzero_ps(), _CMP_EQ_OQ));
    const __m128i zero = _mm_packs_epi32(_mm256_castsi256_si128(zero32),
                                         _mm256_extracti128_si256(zero32, 1));
    for (int m = 0; m < kMagnitudes; ++m) {
      const __m256 v = m < m4::kClipRatioCount
                           ? _mm256_div_ps(_mm256_mul_ps(a, _mm256_set1_ps(m4::kClipRatios[m])),
                                           _mm256_set1_ps(7.0f))
                           : _mm256_div_ps(a, _mm256_set1_ps(8.0f));
      __m128i bits = _mm256_cvtps_ph(v, kRoundNearest);
      bits = _mm_max_epu16(_mm_min_epu16(bits, _mm_set1_epi16(0x7bff)), _mm_set1_epi16(1));
      bits = _mm_blendv_epi8(bits, one, zero);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(cand[m] + h), bits);
      _mm256_storeu_ps(scale[m] + h, _mm256_cvtph_ps(bits));
      if (m == 0) continue;
      const __m128i neg = _mm_blendv_epi8(_mm_or_si128(bits, sign), one, zero);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(cand[m + kMagnitudes - 1] + h), neg);
    }
  }
}

// screen_avx512 on 8 lanes at a time (see there).
QF_AVX2 QF_INLINE void screen_avx2(const float* tile, int64_t bs, const float* scale, float* fp,
                                   float* fn) {
  for (int64_t h = 0; h < kLanes; h += 8) {
    const __m256 s = _mm256_loadu_ps(scale + h);
    const __m256 r = _mm256_div_ps(_mm256_set1_ps(1.0f), s);
    __m256 p0 = _mm256_setzero_ps(), p1 = p0, n0 = p0, n1 = p0;
    auto row = [&](int64_t at, __m256& p, __m256& n) QF_AVX2 {
      const __m256 w = _mm256_loadu_ps(tile + at * kLanes + h);
      const __m256 q = _mm256_round_ps(_mm256_mul_ps(w, r), kRoundNearest);
      const __m256 cp =
          _mm256_min_ps(_mm256_max_ps(q, _mm256_set1_ps(-8.0f)), _mm256_set1_ps(7.0f));
      const __m256 cn =
          _mm256_max_ps(_mm256_min_ps(q, _mm256_set1_ps(8.0f)), _mm256_set1_ps(-7.0f));
      const __m256 ep = _mm256_fnmadd_ps(s, cp, w);
      const __m256 en = _mm256_fnmadd_ps(s, cn, w);
      p = _mm256_fmadd_ps(ep, ep, p);
      n = _mm256_fmadd_ps(en, en, n);
    };
    int64_t at = 0;
    for (; at + 2 <= bs; at += 2) {
      row(at, p0, n0);
      row(at + 1, p1, n1);
    }
    if (at < bs) row(at, p0, n0);
    _mm256_storeu_ps(fp + h, _mm256_add_ps(p0, p1));
    _mm256_storeu_ps(fn + h, _mm256_add_ps(n0, n1));
  }
}

// The AVX2 search: search_avx512's candidates and screen on 8 lanes at a time, then the
// generic choice, fit and refinement.
QF_AVX2 void search_avx2(const float* tile, int64_t bs, const float* amax, uint16_t* sb) {
  alignas(32) uint16_t cand[kCandidates][kLanes];
  alignas(32) float scale[kMagnitudes][kLanes];
  alignas(32) float screen[kCandidates][kLanes];
  alignas(32) float unused[kLanes];
  candidates_avx2(amax, cand, scale);
  for (int mag = 0; mag < kMagnitudes; ++mag) {
    float* fn = mag == 0 ? unused : screen[mag + kMagnitudes - 1];
    screen_avx2(tile, bs, scale[mag], screen[mag], fn);
  }
  choose_candidates(tile, bs, amax, cand, screen, screen_bound(bs, kInt4ScreenRho), sb);
  refine_lanes(tile, bs, fit_avx2, sb);
}
QF_AVX2 void codes_avx2(const float* t, int64_t bs, const float* sf, int8_t* c, double* m,
                        double* s, double* n) {
  codes_lanes(t, bs, sf, c, m, s, n);
}

// The AVX-512 steps, one group per lane of a 16-float vector. Where they fuse a multiply-add,
// its product is exact (s q in float: 11 + 4 significant bits; e e, w q, w w and q q in
// double), so the fused result is the rounded sum the separate operations give: the same
// bits as the generic steps. The screen alone differs: see screen_avx512.
// GCC 12's intrinsics headers fill unused result lanes from a self-initialised variable
// (_mm512_undefined_ps), which -Wmaybe-uninitialized reports once inlined here.
#pragma GCC diagnostic push
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#pragma GCC diagnostic ignored "-Wuninitialized"

// clamp(round_half_even(x), -8, 7) for x = w / s (never NaN): int4_math::quantize_one's code.
QF_AVX512 QF_INLINE __m512 code_avx512(__m512 x) {
  const __m512 q = _mm512_roundscale_ps(x, kRoundNearest);
  return _mm512_min_ps(_mm512_max_ps(q, _mm512_set1_ps(-8.0f)), _mm512_set1_ps(7.0f));
}

QF_AVX512 QF_INLINE __m512d low_pd(__m512 v) { return _mm512_cvtps_pd(_mm512_castps512_ps256(v)); }
QF_AVX512 QF_INLINE __m512d high_pd(__m512 v) {
  return _mm512_cvtps_pd(_mm512_extractf32x8_ps(v, 1));
}

// Every candidate's bits (int4_math::candidate_scale_bits on 16 lanes: the same multiply and
// division, then the IEEE conversion to fp16, half to even, as f32_to_f16) and each magnitude's
// positive scale as float.
QF_AVX512 QF_INLINE void candidates_avx512(const float* amax, uint16_t (*cand)[kLanes],
                                           float (*scale)[kLanes]) {
  const __m512 a = _mm512_loadu_ps(amax);
  const __mmask16 zero = _mm512_cmp_ps_mask(a, _mm512_setzero_ps(), _CMP_EQ_OQ);
  for (int m = 0; m < kMagnitudes; ++m) {
    const __m512 v = m < m4::kClipRatioCount
                         ? _mm512_div_ps(_mm512_mul_ps(a, _mm512_set1_ps(m4::kClipRatios[m])),
                                         _mm512_set1_ps(7.0f))
                         : _mm512_div_ps(a, _mm512_set1_ps(8.0f));
    __m256i h = _mm512_cvtps_ph(v, kRoundNearest);
    h = _mm256_max_epu16(_mm256_min_epu16(h, _mm256_set1_epi16(0x7bff)), _mm256_set1_epi16(1));
    const __m256i one = _mm256_set1_epi16(static_cast<int16_t>(m4::kF16One));
    h = _mm256_mask_blend_epi16(zero, h, one);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(cand[m]), h);
    _mm512_storeu_ps(scale[m], _mm512_cvtph_ps(h));
    if (m == 0) continue;
    const __m256i sign = _mm256_set1_epi16(static_cast<int16_t>(m4::kF16SignBit));
    const __m256i neg = _mm256_mask_blend_epi16(zero, _mm256_or_si256(h, sign), one);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(cand[m + kMagnitudes - 1]), neg);
  }
}

struct ScreenConsts {
  __m512 s, r;
};
struct ScreenSums {
  __m512 p, n;  // error sums for +s and -s
};

// One row of screen_avx512.
QF_AVX512 QF_INLINE void screen_row(const float* row, const ScreenConsts& k, ScreenSums& sum) {
  const __m512 w = _mm512_loadu_ps(row);
  const __m512 q = _mm512_roundscale_ps(_mm512_mul_ps(w, k.r), kRoundNearest);
  const __m512 cp = _mm512_min_ps(_mm512_max_ps(q, _mm512_set1_ps(-8.0f)), _mm512_set1_ps(7.0f));
  const __m512 cn = _mm512_max_ps(_mm512_min_ps(q, _mm512_set1_ps(8.0f)), _mm512_set1_ps(-7.0f));
  const __m512 ep = _mm512_fnmadd_ps(k.s, cp, w);  // +s: codes in [-8, 7]
  const __m512 en = _mm512_fnmadd_ps(k.s, cn, w);  // -s: codes -cn in [-8, 7]
  sum.p = _mm512_fmadd_ps(ep, ep, sum.p);
  sum.n = _mm512_fmadd_ps(en, en, sum.n);
}

// The screen of one magnitude s > 0 and its negative candidate -s, into fp and fn: codes from
// x' = w * fl(1 / s), not from x = fl(w / s) (a division per element and magnitude was a third
// of the search). Both are within 2.0001 u |w / s| of w / s, so their codes differ only where a
// half-integer h lies between them, and codes clamped to [-8, 8] only for |w / s| < 9: w / s is
// then within 18.01 u of h and the two codes are h's neighbours, so |w / s - c| lies in
// [1/2 - 18.01 u, 1/2 + 18.01 u] for both. With each error's own rounding (1 +- u), the two
// squared terms are within a factor 1 + 149 u < 1 + 2^-15 = kScreenRho of each other, which
// choose_candidates' bound takes as rho. (Such elements are common: bf16 weights over fp16
// scales often land on a half-integer exactly; the wider bound left 1.7% of the groups of
// bench/bench_export.py's weights for the exact evaluation, against 1.4% with exact codes.)
// The sums use fused multiply-adds in two chains, which the bound allows.
constexpr double kScreenRho = kInt4ScreenRho;

QF_AVX512 QF_INLINE void screen_avx512(const float* tile, int64_t bs, const float* scale,
                                       float* fp, float* fn) {
  const __m512 s = _mm512_loadu_ps(scale);
  const ScreenConsts k{s, _mm512_div_ps(_mm512_set1_ps(1.0f), s)};
  ScreenSums a{}, b{};
  int64_t at = 0;
  for (; at + 2 <= bs; at += 2) {
    screen_row(tile + at * kLanes, k, a);
    screen_row(tile + (at + 1) * kLanes, k, b);
  }
  if (at < bs) screen_row(tile + at * kLanes, k, a);
  _mm512_storeu_ps(fp, _mm512_add_ps(a.p, b.p));
  _mm512_storeu_ps(fn, _mm512_add_ps(a.n, b.n));
}

// choose_candidates on 16 lanes at once; lanes with more than one survivor go to exact_pick.
QF_AVX512 QF_INLINE void choose_avx512(const float* tile, int64_t bs, const float* amax,
                                       const uint16_t (*cand)[kLanes],
                                       const float (*screen)[kLanes], const ScreenBound& bound,
                                       uint16_t* sb) {
  __m512 least = _mm512_loadu_ps(screen[0]);
  for (int k = 1; k < kCandidates; ++k) least = _mm512_min_ps(least, _mm512_loadu_ps(screen[k]));
  const __mmask16 zero = _mm512_cmp_ps_mask(_mm512_loadu_ps(amax), _mm512_setzero_ps(), _CMP_EQ_OQ);
  const __mmask16 bounded =
      bound.usable ? _mm512_cmp_ps_mask(least, _mm512_set1_ps(0x1p126f), _CMP_LT_OQ) : 0;
  const __m512d sigma = _mm512_set1_pd(bound.sigma), factor = _mm512_set1_pd(bound.factor);
  auto limit = [&](__m512d v) QF_AVX512 {
    return _mm512_add_pd(_mm512_mul_pd(_mm512_add_pd(v, sigma), factor), sigma);
  };
  const __m512d limit_lo = limit(low_pd(least)), limit_hi = limit(high_pd(least));
  uint16_t survives[kCandidates];
  int pick[kLanes] = {};
  uint32_t found = zero, multi = 0;  // a zero-amax lane keeps candidate 0
  for (int k = 0; k < kCandidates; ++k) {
    const __m512 v = _mm512_loadu_ps(screen[k]);
    const uint32_t in = _mm512_cmp_pd_mask(low_pd(v), limit_lo, _CMP_LE_OQ) |
                        (uint32_t{_mm512_cmp_pd_mask(high_pd(v), limit_hi, _CMP_LE_OQ)} << 8);
    const uint32_t m = ((in & bounded) | (~uint32_t{bounded} & 0xffffu)) & ~uint32_t{zero};
    survives[k] = static_cast<uint16_t>(m);
    multi |= m & found;
    for (uint32_t fresh = m & ~found; fresh != 0; fresh &= fresh - 1) {
      pick[std::countr_zero(fresh)] = k;
    }
    found |= m;
  }
  for (; multi != 0; multi &= multi - 1) {
    const int j = std::countr_zero(multi);
    uint32_t lane = 0;
    for (int k = 0; k < kCandidates; ++k) lane |= uint32_t{(survives[k] >> j) & 1u} << k;
    pick[j] = exact_pick(tile, bs, j, cand, lane);
  }
  for (int64_t j = 0; j < kLanes; ++j) sb[j] = cand[pick[j]][j];
}

// fit_full on 16 lanes: error, sum w q, sum q q in double, rows in order. sum q q is summed in
// float, exact while below 2^24 (q q <= 64): groups of up to 2^18 values.
QF_AVX512 void fit_avx512(const float* tile, int64_t bs, const float* scale, double* err,
                          double* wq, double* qq) {
  if (bs > (int64_t{1} << 18)) {
    fit_full<16>(tile, bs, scale, err, wq, qq);
    return;
  }
  const __m512 s = _mm512_loadu_ps(scale);
  __m512d e0 = _mm512_setzero_pd(), e1 = e0, b0 = e0, b1 = e0;
  __m512 c = _mm512_setzero_ps();
  for (int64_t at = 0; at < bs; ++at) {
    const float* row = tile + at * kLanes;
    const __m512 w = _mm512_loadu_ps(row);
    const __m512 q = code_avx512(_mm512_div_ps(w, s));
    const __m512 e = _mm512_fnmadd_ps(s, q, w);
    const __m512d el = low_pd(e), eh = high_pd(e);
    e0 = _mm512_fmadd_pd(el, el, e0);
    e1 = _mm512_fmadd_pd(eh, eh, e1);
    b0 = _mm512_fmadd_pd(_mm512_cvtps_pd(_mm256_loadu_ps(row)), low_pd(q), b0);
    b1 = _mm512_fmadd_pd(_mm512_cvtps_pd(_mm256_loadu_ps(row + 8)), high_pd(q), b1);
    c = _mm512_fmadd_ps(q, q, c);
  }
  _mm512_storeu_pd(err, e0);
  _mm512_storeu_pd(err + 8, e1);
  _mm512_storeu_pd(wq, b0);
  _mm512_storeu_pd(wq + 8, b1);
  _mm512_storeu_pd(qq, low_pd(c));
  _mm512_storeu_pd(qq + 8, high_pd(c));
}

QF_AVX512 void search_avx512(const float* tile, int64_t bs, const float* amax, uint16_t* sb) {
  alignas(64) uint16_t cand[kCandidates][kLanes];
  alignas(64) float scale[kMagnitudes][kLanes];
  alignas(64) float screen[kCandidates][kLanes];
  alignas(64) float unused[kLanes];
  candidates_avx512(amax, cand, scale);
  for (int mag = 0; mag < kMagnitudes; ++mag) {
    float* fn = mag == 0 ? unused : screen[mag + kMagnitudes - 1];
    screen_avx512(tile, bs, scale[mag], screen[mag], fn);
  }
  choose_avx512(tile, bs, amax, cand, screen, screen_bound(bs, kScreenRho), sb);
  refine_lanes(tile, bs, fit_avx512, sb);
}

// codes_lanes on 16 lanes.
QF_AVX512 void codes_avx512(const float* tile, int64_t bs, const float* sf, int8_t* codes,
                            double* max_abs, double* signal, double* noise) {
  const __m512 s = _mm512_loadu_ps(sf);
  const __m512d magnitude = _mm512_castsi512_pd(_mm512_set1_epi64(0x7fffffffffffffff));
  __m512d m0 = _mm512_setzero_pd(), m1 = m0, g0 = m0, g1 = m0, n0 = m0, n1 = m0;
  for (int64_t at = 0; at < bs; ++at) {
    const __m512 w = _mm512_loadu_ps(tile + at * kLanes);
    const __m512 q = code_avx512(_mm512_div_ps(w, s));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + at * kLanes),
                     _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(q)));
    const __m512 deq = _mm512_mul_ps(q, s);
    const __m512d wl = low_pd(w), wh = high_pd(w);
    const __m512d el = _mm512_sub_pd(wl, low_pd(deq)), eh = _mm512_sub_pd(wh, high_pd(deq));
    m0 = _mm512_max_pd(_mm512_and_pd(el, magnitude), m0);
    m1 = _mm512_max_pd(_mm512_and_pd(eh, magnitude), m1);
    g0 = _mm512_fmadd_pd(wl, wl, g0);
    g1 = _mm512_fmadd_pd(wh, wh, g1);
    // e is a double difference of floats, not always exact squared: multiply, then add.
    n0 = _mm512_add_pd(n0, _mm512_mul_pd(el, el));
    n1 = _mm512_add_pd(n1, _mm512_mul_pd(eh, eh));
  }
  _mm512_storeu_pd(max_abs, m0);
  _mm512_storeu_pd(max_abs + 8, m1);
  _mm512_storeu_pd(signal, g0);
  _mm512_storeu_pd(signal + 8, g1);
  _mm512_storeu_pd(noise, n0);
  _mm512_storeu_pd(noise + 8, n1);
}

// fill_16bit on AVX-512.
QF_AVX512 bool fill_avx512(const std::byte* w, DType dtype, int64_t first, int64_t groups,
                           int64_t bs, float* tile) {
  if (dtype != DType::BF16 && dtype != DType::F16) return false;
  const bool bf16 = dtype == DType::BF16;
  const auto widen = [bf16](float* row, __m128i low, __m128i high) QF_AVX512 {
    const __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(low), high, 1);
    const __m512i wide = _mm512_cvtepu16_epi32(v);
    _mm512_storeu_ps(row, bf16 ? _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16))
                               : _mm512_cvtph_ps(v));
  };
  fill_16bit(w, bf16, first, groups, bs, tile, widen);
  return true;
}
#pragma GCC diagnostic pop
#endif

bool cpu_has_avx512() {
#if defined(__x86_64__) && defined(__GNUC__)
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
         __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512bw");
#else
  return false;
#endif
}

bool cpu_has_avx2() {
#if defined(__x86_64__) && defined(__GNUC__)
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;  // F16C: CPUID leaf 1, ECX bit 29
  const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
#else
  return false;
#endif
}

LaneSteps pick_steps(Int4GroupIsa isa) {
#if defined(__x86_64__) && defined(__GNUC__)
  const bool best = isa == Int4GroupIsa::Best;
  if ((best || isa == Int4GroupIsa::Avx512) && cpu_has_avx512()) {
    return {search_avx512, codes_avx512, fill_avx512, pack_sse2};
  }
  if ((best || isa == Int4GroupIsa::Avx512 || isa == Int4GroupIsa::Avx2) && cpu_has_avx2()) {
    return {search_avx2, codes_avx2, fill_avx2, pack_sse2};
  }
#endif
  (void)isa;
#if defined(__x86_64__) && defined(__GNUC__)
  return {search_base, codes_base, fill_sse2, pack_sse2};
#else
  return {search_base, codes_base};
#endif
}

}  // namespace

bool int4_group_isa_available(Int4GroupIsa isa) {
  switch (isa) {
    case Int4GroupIsa::Avx512: return cpu_has_avx512();
    case Int4GroupIsa::Avx2: return cpu_has_avx2();
    case Int4GroupIsa::Base:
    case Int4GroupIsa::Best: break;
  }
  return true;
}

Int4GroupQuant quantize_int4_groups(const Tensor& weight, int64_t block_size, Int4Scale rule,
                                    Int4GroupIsa isa) {
  const DType dtype = weight.dtype();
  if (weight.rank() != 2 || block_size < 1 || weight.shape()[1] % block_size != 0 ||
      (dtype != DType::F32 && dtype != DType::F16 && dtype != DType::BF16)) {
    fail_internal("quantize_int4_groups: " + std::string(dtype_name(dtype)) + " " +
                  shape_to_string(weight.shape()) + " in groups of " +
                  std::to_string(block_size));
  }
  const int64_t out = weight.shape()[0], in = weight.shape()[1];
  const int64_t bs = block_size;
  if (bs > (int64_t{1} << 24)) fail_internal("quantize_int4_groups: groups above 2^24 values");
  const int64_t n = out * in;
  const int64_t groups = n / bs;
  const int64_t chunks = (groups + kLanes - 1) / kLanes;
  Int4GroupQuant result;
  result.values = Tensor(DType::I4, {out, in});
  result.scale = Tensor(dtype, {out, in / bs});
  uint8_t* packed = result.values.mutable_data<uint8_t>().data();
  std::byte* scale_bytes = result.scale.mutable_bytes().data();
  const std::byte* w = weight.bytes().data();
  const LaneSteps steps = pick_steps(isa);
  const bool search = rule == Int4Scale::Mse;

  std::vector<double> chunk_max(static_cast<size_t>(chunks)), chunk_signal(chunk_max.size()),
      chunk_noise(chunk_max.size());
  std::atomic<bool> non_finite{false};
  const int threads = n >= kParallelMin ? cpu_threads() : 1;
  // A chunk a task on the task pool (kernels/cpu/task_pool.h); each thread's buffers made by its
  // first task.
  struct ChunkScratch {
    std::vector<float> tile;
    std::vector<int8_t> codes, natural;
  };
  std::vector<ChunkScratch> scratch(static_cast<size_t>(threads));
  run_tasks(threads, chunks, [&](int64_t chunk, int slot) {
    ChunkScratch& sc = scratch[static_cast<size_t>(slot)];
    if (sc.tile.empty()) {
      sc.tile.resize(static_cast<size_t>(bs * kLanes));
      sc.codes.resize(sc.tile.size());
      sc.natural.resize(sc.tile.size());
    }
    std::vector<float>& tile = sc.tile;
    std::vector<int8_t>& codes = sc.codes;
    std::vector<int8_t>& natural = sc.natural;
    alignas(64) float amax[kLanes], sf[kLanes];
    alignas(64) uint16_t sb[kLanes];
    alignas(64) double lane_max[kLanes], lane_signal[kLanes], lane_noise[kLanes];
    const int64_t g0 = chunk * kLanes;
    const int64_t count = std::min(kLanes, groups - g0);
    if (steps.fill == nullptr || !steps.fill(w, dtype, g0, count, bs, tile.data())) {
      fill_generic(w, dtype, g0, count, bs, tile.data());
    }
    int32_t mbits[kLanes] = {};
    for (int64_t r = 0; r < bs; ++r) {
      const float* t = tile.data() + r * kLanes;
      for (int64_t j = 0; j < kLanes; ++j)
        mbits[j] = std::max(mbits[j], std::bit_cast<int32_t>(t[j]) & 0x7fffffff);
    }
    bool finite = true;
    for (int64_t j = 0; j < kLanes; ++j) {
      finite = finite && mbits[j] < 0x7f800000;
      amax[j] = mbits[j] >= 0x7f800000 ? 0.0f : std::bit_cast<float>(mbits[j]);
    }
    if (!finite) {
      non_finite.store(true, std::memory_order_relaxed);
      return;
    }
    if (search) {
      steps.search(tile.data(), bs, amax, sb);
    } else {
      for (int64_t j = 0; j < kLanes; ++j) sb[j] = m4::scale_bits(amax[j]);
    }
    // The stored scale: fp16 kept for f16 and f32 weights; a bf16 weight's rounded to bf16
    // (never to 0), and its codes come from that rounded scale.
    for (int64_t j = 0; j < kLanes; ++j) {
      const auto at = static_cast<size_t>(g0 + j);
      if (dtype == DType::BF16) {
        auto b = f32_to_bf16(f16_to_f32(sb[j]));
        if ((b & 0x7fff) == 0) b = static_cast<uint16_t>((b & 0x8000) | kBf16MinSubnormal);
        sf[j] = bf16_to_f32(b);
        if (j < count) std::memcpy(scale_bytes + 2 * at, &b, 2);
      } else {
        sf[j] = f16_to_f32(sb[j]);
        if (j >= count) continue;
        if (dtype == DType::F16) {
          std::memcpy(scale_bytes + 2 * at, &sb[j], 2);
        } else {
          std::memcpy(scale_bytes + 4 * at, &sf[j], 4);
        }
      }
    }
    steps.codes(tile.data(), bs, sf, codes.data(), lane_max, lane_signal, lane_noise);
    double cm = 0.0, cs = 0.0, cn = 0.0;
    for (int64_t j = 0; j < count; ++j) {
      cm = std::max(cm, lane_max[j]);
      cs += lane_signal[j];
      cn += lane_noise[j];
    }
    chunk_max[static_cast<size_t>(chunk)] = cm;
    chunk_signal[static_cast<size_t>(chunk)] = cs;
    chunk_noise[static_cast<size_t>(chunk)] = cn;
    uint8_t* o = packed + g0 * bs / 2;
    if (steps.pack == nullptr || !steps.pack(codes.data(), bs, count, o)) {
      pack_chunk(codes.data(), bs, count, natural.data(), o);
    }
  });
  if (non_finite.load()) {
    result.finite = false;
    return result;
  }
  for (size_t c = 0; c < chunk_max.size(); ++c) {
    result.max_abs_error = std::max(result.max_abs_error, chunk_max[c]);
    result.signal += chunk_signal[c];
    result.noise += chunk_noise[c];
  }
  return result;
}

}  // namespace qforge
