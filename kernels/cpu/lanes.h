#pragma once
// Vector lanes for the CPU kernels that compute element by element without branches
// (vmath_cpu.cpp's erf/exp/sigmoid, calib_cpu.cpp's entropy terms): GCC/Clang vector extension
// types, a broadcast and a lane select, all inlined into entry points that are compiled twice,
// for the SSE2 baseline and with target("avx2") (chosen at run time by cpu_has_avx2()), and
// with target("avx512f") where cpu_has_avx512f(). Lanes
// do the same IEEE operations as scalar code (the project builds with -ffp-contract=off, so no
// FMA), so every width gives the same bits.
#include <cstddef>
#include <cstdint>

// The 8-float and 4-double helpers never cross a call boundary (all inlined), so the AVX
// argument ABI the compiler warns about does not arise.
#pragma GCC diagnostic ignored "-Wpsabi"

#define QF_LANES_INLINE [[gnu::always_inline]] inline

namespace qforge::lanes {

// W lanes of T: V the values, M the lane masks comparisons give (signed integers of T's width),
// U the bits as unsigned integers (shifted logically: AVX2 has no 64-bit arithmetic shift).
// Spelled out per width: GCC drops vector_size with a size that depends on a template argument.
template <typename T, int W>
struct Lanes;

#define QF_LANE_TYPES(T, W, S, US)                                     \
  template <>                                                          \
  struct Lanes<T, W> {                                                 \
    using V = T __attribute__((vector_size(sizeof(T) * W)));           \
    using M = S __attribute__((vector_size(sizeof(T) * W)));           \
    using U = US __attribute__((vector_size(sizeof(T) * W)));          \
  };
QF_LANE_TYPES(float, 4, int32_t, uint32_t)
QF_LANE_TYPES(float, 8, int32_t, uint32_t)
QF_LANE_TYPES(float, 16, int32_t, uint32_t)
QF_LANE_TYPES(double, 2, int64_t, uint64_t)
QF_LANE_TYPES(double, 4, int64_t, uint64_t)
QF_LANE_TYPES(double, 8, int64_t, uint64_t)
#undef QF_LANE_TYPES

// Every lane `v`.
template <typename V, typename T>
QF_LANES_INLINE V splat(T v) {
  V out;
  for (size_t i = 0; i < sizeof(V) / sizeof(T); ++i) out[i] = v;
  return out;
}

// mask ? a : b, lane by lane (mask lanes all ones or all zeros, as comparisons give them).
template <typename V, typename M>
QF_LANES_INLINE V select(M mask, V a, V b) {
  return reinterpret_cast<V>((mask & reinterpret_cast<M>(a)) | (~mask & reinterpret_cast<M>(b)));
}

// True where the CPU runs AVX2 (x86-64; checked once).
inline bool cpu_has_avx2() {
#if defined(__x86_64__)
  static const bool yes = __builtin_cpu_supports("avx2");
  return yes;
#else
  return false;
#endif
}

// True where the CPU runs AVX-512F and the OS saves its registers (x86-64; checked once).
inline bool cpu_has_avx512f() {
#if defined(__x86_64__)
  static const bool yes = __builtin_cpu_supports("avx512f");
  return yes;
#else
  return false;
#endif
}

}  // namespace qforge::lanes
