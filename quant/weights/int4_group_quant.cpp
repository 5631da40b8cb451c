#include "quant/weights/int4_group_quant.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <vector>

#include "ir/error.h"
#include "ir/half.h"
#include "kernels/device.h"
#include "kernels/int4_math.h"

// The lane helpers are forced inline so that each ISA build of the chunk steps compiles them for
// its own vectors (as kernels/cpu/int4_matmul_cpu.cpp does). No build uses FMA (-ffp-contract=off
// and no "fma" target), and every operation is an IEEE one on one lane, so all builds give the
// same bits.
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

// kernels/cpu/int4_cpu.cpp's search for each lane (group): the candidates in order, the first
// strictly smallest error kept, then up to kRefineRounds least-squares refinements, each kept
// only when strictly better. `amax` finite; `sb` receives the fp16 scale bits.
template <int64_t W>
QF_INLINE void search_lanes(const float* tile, int64_t bs, const float* amax, uint16_t* sb) {
  alignas(64) uint16_t cand[kCandidates][kLanes];
  for (int k = 0; k < kCandidates; ++k)
    for (int64_t j = 0; j < kLanes; ++j) cand[k][j] = m4::candidate_scale_bits(amax[j], k);
  alignas(64) float screen[kCandidates][kLanes];
  alignas(64) float s[kLanes], ns[kLanes];
  f16_lanes(cand[0], s);
  screen_pair<false, W>(tile, bs, s, s, screen[0], nullptr);
  // Magnitude m's negative candidate is -s (its bits are s's with the sign set), except where
  // amax is 0: every candidate is then 1.0 and every error 0 (all values are +-0), whatever
  // the codes; such a lane keeps candidate 0 below.
  for (int mag = 1; mag < kMagnitudes; ++mag) {
    f16_lanes(cand[mag], s);
    f16_lanes(cand[mag + kMagnitudes - 1], ns);
    screen_pair<true, W>(tile, bs, s, ns, screen[mag], screen[mag + kMagnitudes - 1]);
  }
  // Phase 2, per lane: the exact search's winner (least double error, ties to the earlier
  // candidate) is among the candidates whose screen is within the float sum's error bound of
  // the least screen. A recursive float sum of n terms, each a rounded product, is within
  // gamma = (n + 1) u / (1 - (n + 1) u) of the exact sum, relative (u = 2^-24), plus
  // (n + 1) 2^-149 for subnormal results; so a candidate whose screen exceeds the least by the
  // factor (1 + gamma) / (1 - gamma) has a larger exact error than the least screen's (the
  // factor 1 + 2^-20 covers the double sums' own rounding, at most n 2^-53 relative). One
  // candidate left wins; with more, each is evaluated exactly (one whose bits repeat an earlier
  // one's has its error and loses the tie): 1.4% of the groups of bench/bench_export.py's bf16
  // weights. A screen that overflowed, or a group too long for the bound, keeps all.
  const double nu = static_cast<double>(bs + 1) * 0x1p-24;
  const bool screen_usable = nu < 1e-2;
  const double gamma = nu / (1.0 - nu);
  const double ratio = (1.0 + gamma) / (1.0 - gamma) * (1.0 + 0x1p-20);
  const double slack = static_cast<double>(bs + 1) * 0x1p-148;
  for (int64_t j = 0; j < kLanes; ++j) {
    if (amax[j] == 0.0f) {
      sb[j] = cand[0][j];
      continue;
    }
    float least = screen[0][j];
    for (int k = 1; k < kCandidates; ++k) least = std::min(least, screen[k][j]);
    const bool bounded = screen_usable && least < 0x1p126f;
    const double limit = static_cast<double>(least) * ratio + slack;
    auto survives = [&](int k) {
      return !bounded || static_cast<double>(screen[k][j]) <= limit;
    };
    int survivors = 0, pick = 0;
    for (int k = 0; k < kCandidates; ++k) {
      if (survives(k) && survivors++ == 0) pick = k;
    }
    if (survivors > 1) {
      double least_exact = 0.0;
      uint16_t seen[kCandidates];
      int seen_count = 0;
      for (int k = 0; k < kCandidates; ++k) {
        if (!survives(k)) continue;
        if (std::find(seen, seen + seen_count, cand[k][j]) != seen + seen_count) continue;
        seen[seen_count++] = cand[k][j];
        const double err = exact_error(tile, bs, j, f16_to_f32(cand[k][j]));
        if (seen_count == 1 || err < least_exact) {
          least_exact = err;
          pick = k;
        }
      }
    }
    sb[j] = cand[pick][j];
  }
  alignas(64) double best[kLanes], wq[kLanes], qq[kLanes], e[kLanes], cwq[kLanes], cqq[kLanes];
  f16_lanes(sb, s);
  fit_full<W>(tile, bs, s, best, wq, qq);  // the chosen candidate's sums: its exact evaluation
  bool refining[kLanes];
  std::fill(refining, refining + kLanes, true);
  alignas(64) uint16_t next[kLanes];
  for (int round = 0; round < m4::kRefineRounds; ++round) {
    bool any = false;
    for (int64_t j = 0; j < kLanes; ++j) {
      const uint16_t n = m4::refined_scale_bits(wq[j], qq[j]);
      if (n == 0 || n == sb[j]) refining[j] = false;
      next[j] = refining[j] ? n : sb[j];
      any = any || refining[j];
    }
    if (!any) break;
    f16_lanes(next, s);
    fit_full<W>(tile, bs, s, e, cwq, cqq);
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

struct LaneSteps {
  void (*search)(const float*, int64_t, const float*, uint16_t*);
  void (*codes)(const float*, int64_t, const float*, int8_t*, double*, double*, double*);
};

void search_base(const float* t, int64_t bs, const float* a, uint16_t* sb) {
  search_lanes<4>(t, bs, a, sb);
}
void codes_base(const float* t, int64_t bs, const float* sf, int8_t* c, double* m, double* s,
                double* n) {
  codes_lanes(t, bs, sf, c, m, s, n);
}

#if defined(__x86_64__) && defined(__GNUC__)
#define QF_AVX2 __attribute__((target("avx2")))
#define QF_AVX512 \
  __attribute__((target("avx512f,avx512vl,avx512dq,avx512bw,prefer-vector-width=512")))
QF_AVX2 void search_avx2(const float* t, int64_t bs, const float* a, uint16_t* sb) {
  search_lanes<8>(t, bs, a, sb);
}
QF_AVX2 void codes_avx2(const float* t, int64_t bs, const float* sf, int8_t* c, double* m,
                        double* s, double* n) {
  codes_lanes(t, bs, sf, c, m, s, n);
}
QF_AVX512 void search_avx512(const float* t, int64_t bs, const float* a, uint16_t* sb) {
  search_lanes<16>(t, bs, a, sb);
}
QF_AVX512 void codes_avx512(const float* t, int64_t bs, const float* sf, int8_t* c, double* m,
                            double* s, double* n) {
  codes_lanes(t, bs, sf, c, m, s, n);
}
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
  return __builtin_cpu_supports("avx2");
#else
  return false;
#endif
}

LaneSteps pick_steps(Int4GroupIsa isa) {
#if defined(__x86_64__) && defined(__GNUC__)
  const bool best = isa == Int4GroupIsa::Best;
  if ((best || isa == Int4GroupIsa::Avx512) && cpu_has_avx512()) {
    return {search_avx512, codes_avx512};
  }
  if ((best || isa == Int4GroupIsa::Avx512 || isa == Int4GroupIsa::Avx2) && cpu_has_avx2()) {
    return {search_avx2, codes_avx2};
  }
#endif
  (void)isa;
  return {search_base, codes_base};
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
  int non_finite = 0;
  const int threads = n >= kParallelMin ? cpu_threads() : 1;
#pragma omp parallel num_threads(threads) reduction(| : non_finite)
  {
    std::vector<float> tile(static_cast<size_t>(bs * kLanes));
    std::vector<int8_t> codes(tile.size()), natural(tile.size());
    alignas(64) float amax[kLanes], sf[kLanes];
    alignas(64) uint16_t sb[kLanes];
    alignas(64) double lane_max[kLanes], lane_signal[kLanes], lane_noise[kLanes];
#pragma omp for schedule(dynamic, 4)
    for (int64_t chunk = 0; chunk < chunks; ++chunk) {
      const int64_t g0 = chunk * kLanes;
      const int64_t count = std::min(kLanes, groups - g0);
      switch (dtype) {
        case DType::BF16: fill_tile<DType::BF16>(w, g0, count, bs, tile.data()); break;
        case DType::F16: fill_tile<DType::F16>(w, g0, count, bs, tile.data()); break;
        default: fill_tile<DType::F32>(w, g0, count, bs, tile.data()); break;
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
        non_finite = 1;
        continue;
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
      // Back to element order (group j's value r is element j * bs + r of the chunk), then two
      // codes a byte. A chunk holds kLanes * bs elements, an even count, so it starts on a whole
      // byte; a last odd element takes a padding lane's code, 0, as its high nibble.
      for (int64_t j = 0; j < count; ++j) {
        int8_t* to = natural.data() + j * bs;
        for (int64_t r = 0; r < bs; ++r) to[r] = codes[static_cast<size_t>(r * kLanes + j)];
      }
      const int64_t elems = count * bs;
      if (elems % 2 != 0) natural[static_cast<size_t>(elems)] = 0;
      uint8_t* o = packed + g0 * bs / 2;
      for (int64_t i = 0; i < (elems + 1) / 2; ++i) {
        o[i] = static_cast<uint8_t>(m4::nibble(natural[static_cast<size_t>(2 * i)]) |
                                    (m4::nibble(natural[static_cast<size_t>(2 * i + 1)]) << 4));
      }
    }
  }
  if (non_finite != 0) {
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
