#include "kernels/cpu/quantize_cpu.h"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <vector>

#include "kernels/cpu/task_pool.h"
#include "kernels/device.h"

namespace qforge::cpu {

namespace {

// Work is cut into fixed chunks independent of the thread count; every kernel here is exact
// per element (or a max), so output never depends on how chunks land on threads.
constexpr int64_t kChunk = 16384;
// Below this many elements starting threads costs more than it saves.
constexpr int64_t kParallelMin = 65536;

// |v| as bits: for non-negative floats the integer order is the float order, and it extends to
// finite < +Inf < NaN, which is how non-finite inputs surface in amax. Signed, since the sign bit
// is clear and SSE2 can compare signed 32-bit ints but not unsigned ones, so the loops vectorize.
inline int32_t abs_bits(float v) { return std::bit_cast<int32_t>(v) & 0x7fffffff; }

// Adding and subtracting 1.5 * 2^23 rounds any |v| <= 2^22 to an integer, half to even, under
// the default rounding mode: the same result as std::nearbyint (the tests hold it to that), but
// it vectorizes, where nearbyintf is a libm call per element on baseline x86-64 (no SSE4.1).
constexpr float kRoundMagic = 12582912.0f;
constexpr int32_t kBits127 = std::bit_cast<int32_t>(127.0f);
constexpr int32_t kBitsInf = 0x7f800000;

// clamp(round_half_even(x / scale), -127, 127), NaN -> 0. The clamp runs on the magnitude's
// bits (integer order is float order there) because float compares are branches GCC will not
// if-convert under -ftrapping-math, which would keep the loop scalar. Clamping before rounding
// is exact: ±127 are integers.
inline int8_t quantize_one(float x, float scale) {
  const auto bits = std::bit_cast<int32_t>(x / scale);  // IEEE division, as QuantizeLinear
  const int32_t magnitude = bits & 0x7fffffff;
  int32_t clamped = magnitude > kBits127 ? kBits127 : magnitude;  // also +-Inf
  clamped = magnitude > kBitsInf ? 0 : clamped;                   // NaN
  const auto v = std::bit_cast<float>((bits & INT32_MIN) | clamped);
  return static_cast<int8_t>(static_cast<int32_t>((v + kRoundMagic) - kRoundMagic));
}

// Inner loops over one piece, on raw restrict pointers: an int8_t store may alias anything, so
// without `restrict` the compiler reloads every captured value and does not vectorize.
void quantize_piece(const float* __restrict x, const float* __restrict scales, bool per_element,
                    int8_t* __restrict q, int64_t len) {
  if (per_element) {
    for (int64_t k = 0; k < len; ++k) q[k] = quantize_one(x[k], scales[k]);
  } else {
    const float scale = scales[0];
    for (int64_t k = 0; k < len; ++k) q[k] = quantize_one(x[k], scale);
  }
}

void dequantize_piece(const int8_t* __restrict q, const float* __restrict scales, bool per_element,
                      float* __restrict y, int64_t len) {
  if (per_element) {
    for (int64_t k = 0; k < len; ++k) y[k] = static_cast<float>(q[k]) * scales[k];
  } else {
    const float scale = scales[0];
    for (int64_t k = 0; k < len; ++k) y[k] = static_cast<float>(q[k]) * scale;
  }
}

int thread_count(int64_t n) { return n >= kParallelMin ? cpu_threads() : 1; }

// Calls run(thread, pos, len, c) on pieces of [0, n) of the [outer, channels, inner] view, in
// parallel over fixed chunks (the runtime's task pool, task_pool.h: no OpenMP team whose idle
// threads spin beside the pool's on a small machine); `thread` is the task's slot in
// [0, threads). With inner > 1 a piece lies inside one run of channel c; with inner == 1 it
// covers channels c, c + 1, ..., c + len - 1, so loops over it vectorize along the channel axis.
template <typename Run>
void for_each_piece(int64_t n, int64_t channels, int64_t inner, int threads, Run run) {
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  run_tasks(threads, chunks, [&](int64_t chunk, int thread) {
    const int64_t end = std::min(n, (chunk + 1) * kChunk);
    int64_t pos = chunk * kChunk;
    while (pos < end) {
      const int64_t row = pos / inner;
      const int64_t c = row % channels;
      const int64_t len = inner == 1 ? std::min(channels - c, end - pos)
                                     : std::min(inner - (pos - row * inner), end - pos);
      run(thread, pos, len, c);
      pos += len;
    }
  });
}

}  // namespace

float amax(std::span<const float> x) {
  const auto n = static_cast<int64_t>(x.size());
  const float* data = x.data();
  // Each chunk's maximum, then theirs (max is order-independent).
  std::vector<int32_t> chunk_max(static_cast<size_t>((n + kChunk - 1) / kChunk), 0);
  run_tasks(thread_count(n), static_cast<int64_t>(chunk_max.size()), [&](int64_t chunk, int) {
    int32_t m = 0;
    for (int64_t k = chunk * kChunk; k < std::min(n, (chunk + 1) * kChunk); ++k) {
      m = std::max(m, abs_bits(data[k]));
    }
    chunk_max[static_cast<size_t>(chunk)] = m;
  });
  int32_t m = 0;
  for (const int32_t c : chunk_max) m = std::max(m, c);
  return std::bit_cast<float>(m);
}

void amax_per_channel(std::span<const float> x, int64_t outer, int64_t channels, int64_t inner,
                      std::span<float> out) {
  const int64_t n = outer * channels * inner;
  const int threads = thread_count(n);
  // One row of per-channel maxima per thread, merged at the end (max is order-independent).
  std::vector<int32_t> partial(static_cast<size_t>(threads) * static_cast<size_t>(channels), 0);
  const float* data = x.data();
  for_each_piece(n, channels, inner, threads, [&](int thread, int64_t pos, int64_t len, int64_t c) {
    int32_t* mine = partial.data() + static_cast<int64_t>(thread) * channels;
    if (inner == 1) {
      for (int64_t k = 0; k < len; ++k)
        mine[c + k] = std::max(mine[c + k], abs_bits(data[pos + k]));
    } else {
      int32_t m = mine[c];
      for (int64_t k = 0; k < len; ++k) m = std::max(m, abs_bits(data[pos + k]));
      mine[c] = m;
    }
  });
  for (int64_t c = 0; c < channels; ++c) {
    int32_t m = 0;
    for (int t = 0; t < threads; ++t)
      m = std::max(m, partial[static_cast<size_t>(t * channels + c)]);
    out[static_cast<size_t>(c)] = std::bit_cast<float>(m);
  }
}

void quantize_int8(std::span<const float> x, int64_t channels, int64_t inner,
                   std::span<const float> scales, std::span<int8_t> out) {
  const auto n = static_cast<int64_t>(x.size());
  const float* in = x.data();
  const float* s = scales.data();
  int8_t* q = out.data();
  for_each_piece(n, channels, inner, thread_count(n),
                 [=](int, int64_t pos, int64_t len, int64_t c) {
                   quantize_piece(in + pos, s + c, inner == 1, q + pos, len);
                 });
}

void dequantize_int8(std::span<const int8_t> q, int64_t channels, int64_t inner,
                     std::span<const float> scales, std::span<float> out) {
  const auto n = static_cast<int64_t>(q.size());
  const int8_t* in = q.data();
  const float* s = scales.data();
  float* y = out.data();
  for_each_piece(n, channels, inner, thread_count(n),
                 [=](int, int64_t pos, int64_t len, int64_t c) {
                   dequantize_piece(in + pos, s + c, inner == 1, y + pos, len);
                 });
}

}  // namespace qforge::cpu
