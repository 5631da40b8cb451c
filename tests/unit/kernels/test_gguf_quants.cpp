// GGUF block quantizers against hand-computed blocks (ggml's reference rules: Q8_0 rounds half
// away from zero; Q4_0's scale is signed so the largest-magnitude element is exact; byte j holds
// elements j and j + 16) and against their error bounds on random rows.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "ir/error.h"
#include "ir/half.h"
#include "kernels/gguf_quants.h"

using namespace qforge;
using gguf::TensorType;

namespace {

std::vector<uint8_t> quantize(TensorType type, const std::vector<float>& x) {
  std::vector<std::byte> out(gguf_row_bytes(type, x.size()));
  gguf_quantize_row(type, x, out);
  std::vector<uint8_t> bytes(out.size());
  std::memcpy(bytes.data(), out.data(), out.size());
  return bytes;
}

std::vector<float> dequantize(TensorType type, const std::vector<uint8_t>& bytes, size_t n) {
  std::vector<float> out(n);
  gguf_dequantize_row(type, std::as_bytes(std::span(bytes)), out);
  return out;
}

uint16_t u16_at(const std::vector<uint8_t>& b, size_t at) {
  return static_cast<uint16_t>(b[at] | (b[at + 1] << 8));
}

}  // namespace

TEST(GgufQuants, Q8_0RoundsHalfAwayFromZero) {
  std::vector<float> x(32, 0.0f);
  x[0] = 127.0f;  // amax 127: d = 1, so q = round(x)
  x[1] = -63.5f;
  x[2] = 2.5f;
  x[3] = -2.5f;
  x[4] = 0.49f;
  const auto b = quantize(TensorType::Q8_0, x);
  ASSERT_EQ(b.size(), 34u);
  EXPECT_EQ(u16_at(b, 0), 0x3C00);  // fp16 1.0
  EXPECT_EQ(static_cast<int8_t>(b[2]), 127);
  EXPECT_EQ(static_cast<int8_t>(b[3]), -64);
  EXPECT_EQ(static_cast<int8_t>(b[4]), 3);
  EXPECT_EQ(static_cast<int8_t>(b[5]), -3);
  EXPECT_EQ(static_cast<int8_t>(b[6]), 0);
  EXPECT_EQ(dequantize(TensorType::Q8_0, b, 32)[1], -64.0f);
}

TEST(GgufQuants, Q4_0SignedScaleAndNibbleSplit) {
  std::vector<float> x(32, 0.0f);
  x[0] = 1.0f;    // the first element of largest magnitude, positive: d = 1 / -8 < 0
  x[1] = -0.5f;
  x[2] = 0.25f;
  x[16] = 0.5f;
  x[17] = -1.0f;  // same magnitude, later: the opposite sign gets only 7 steps
  const auto b = quantize(TensorType::Q4_0, x);
  ASSERT_EQ(b.size(), 18u);
  EXPECT_EQ(u16_at(b, 0), 0xB000);  // fp16 -0.125
  EXPECT_EQ(b[2], 0x40);            // q[0] = 0 | q[16] = 4 << 4
  EXPECT_EQ(b[3], 0xFC);            // q[1] = 12 | q[17] = 15 (clamped from 16) << 4
  EXPECT_EQ(b[4], 0x86);            // q[2] = 6 | q[18] = 8 << 4
  for (size_t j = 3; j < 16; ++j) EXPECT_EQ(b[2 + j], 0x88) << j;
  const auto y = dequantize(TensorType::Q4_0, b, 32);
  EXPECT_EQ(y[0], 1.0f);  // the max-magnitude element is exact
  EXPECT_EQ(y[16], 0.5f);
  EXPECT_EQ(y[17], -0.875f);
  EXPECT_EQ(y[5], 0.0f);
}

TEST(GgufQuants, Q4_1ScaleMinAndNibbleSplit) {
  std::vector<float> x(32, -1.0f);
  x[1] = 2.0f;   // max: d = 3 / 15
  x[16] = 0.0f;
  x[17] = 0.5f;
  const auto b = quantize(TensorType::Q4_1, x);
  ASSERT_EQ(b.size(), 20u);
  EXPECT_EQ(u16_at(b, 0), f32_to_f16(3.0f / 15.0f));
  EXPECT_EQ(u16_at(b, 2), 0xBC00);  // m = fp16 -1
  EXPECT_EQ(b[4], 0x50);            // q[0] = 0 | q[16] = 5 << 4
  EXPECT_EQ(b[5], 0x8F);            // q[1] = 15 | q[17] = 8 << 4
  for (size_t j = 2; j < 16; ++j) EXPECT_EQ(b[4 + j], 0x00) << j;
}

TEST(GgufQuants, ZeroBlocksStayZero) {
  const std::vector<float> x(64, 0.0f);
  for (TensorType t : {TensorType::Q8_0, TensorType::Q4_0, TensorType::Q4_1}) {
    const auto y = dequantize(t, quantize(t, x), 64);
    for (float v : y) EXPECT_EQ(v, 0.0f);
  }
}

TEST(GgufQuants, RandomRowsWithinHalfAStep) {
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 0.05f);
  std::vector<float> x(256);
  for (float& v : x) v = dist(rng);
  for (TensorType t : {TensorType::Q8_0, TensorType::Q4_0, TensorType::Q4_1, TensorType::F16,
                       TensorType::BF16, TensorType::F32}) {
    const auto y = dequantize(t, quantize(t, x), x.size());
    for (size_t b = 0; b < x.size() / 32; ++b) {
      float amax = 0.0f, lo = x[b * 32], hi = x[b * 32];
      for (size_t j = 0; j < 32; ++j) {
        amax = std::max(amax, std::fabs(x[b * 32 + j]));
        lo = std::min(lo, x[b * 32 + j]);
        hi = std::max(hi, x[b * 32 + j]);
      }
      float bound = 0.0f;
      if (t == TensorType::Q8_0) bound = amax / 127.0f * 0.51f;
      if (t == TensorType::Q4_0) bound = amax / 8.0f * 1.01f;  // the clamped side: one step
      if (t == TensorType::Q4_1) bound = (hi - lo) / 15.0f * 0.51f + 1e-3f * amax;
      if (t == TensorType::F16) bound = amax * 1e-3f;
      if (t == TensorType::BF16) bound = amax * 4e-3f;
      for (size_t j = 0; j < 32; ++j) {
        EXPECT_LE(std::fabs(y[b * 32 + j] - x[b * 32 + j]), bound)
            << gguf::tensor_type_info(t).name << " block " << b << " element " << j;
      }
    }
  }
}

TEST(GgufQuants, RowNotWholeBlocksIsRefused) {
  EXPECT_THROW(gguf_row_bytes(TensorType::Q4_0, 48), Error);
  EXPECT_EQ(gguf_row_bytes(TensorType::F16, 48), 96u);
  EXPECT_EQ(gguf_row_bytes(TensorType::Q4_1, 64), 40u);
}

// Stored levels and scales re-encoded: every type decodes to exactly q * d, whatever the levels,
// including the extremes -8 and 7 (int4) and a negative scale.
TEST(GgufQuants, EncodedLevelsDecodeToLevelTimesScale) {
  std::mt19937 rng(7);
  for (const TensorType type : {TensorType::Q4_0, TensorType::Q4_1, TensorType::Q8_0}) {
    const int lo = type == TensorType::Q8_0 ? -127 : -8;
    const int hi = type == TensorType::Q8_0 ? 127 : 7;
    std::uniform_int_distribution<int> level(lo, hi);
    std::vector<int8_t> q(96);
    for (auto& v : q) v = static_cast<int8_t>(level(rng));
    q[0] = static_cast<int8_t>(lo);
    q[31] = static_cast<int8_t>(hi);
    const std::vector<uint16_t> d = {f32_to_f16(0.0123f), f32_to_f16(-3.5f),
                                     f32_to_f16(std::ldexp(1.0f, -24))};
    std::vector<std::byte> out(gguf_row_bytes(type, q.size()));
    gguf_encode_levels_row(type, q, d, out);
    std::vector<float> back(q.size());
    gguf_dequantize_row(type, out, back);
    for (size_t i = 0; i < q.size(); ++i) {
      EXPECT_EQ(back[i], static_cast<float>(q[i]) * f16_to_f32(d[i / 32]))
          << gguf::tensor_type_info(type).name << " element " << i;
    }
  }
}

TEST(GgufQuants, EncodedLevelsOutOfRangeAreAnInternalError) {
  std::vector<int8_t> q(32, 0);
  q[5] = 8;  // not an int4 level
  const std::vector<uint16_t> d = {f32_to_f16(1.0f)};
  std::vector<std::byte> out(gguf_row_bytes(TensorType::Q4_0, q.size()));
  EXPECT_THROW(gguf_encode_levels_row(TensorType::Q4_0, q, d, out), Error);
}

// Rows in parallel give each row's gguf_quantize_row bytes, at any thread count.
TEST(GgufQuants, RowsInParallelMatchRowByRow) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t rows = 300, cols = 256;
  std::vector<float> x(static_cast<size_t>(rows * cols));
  for (auto& v : x) v = normal(rng);
  const uint64_t rb = gguf_row_bytes(TensorType::Q4_0, cols);
  std::vector<std::byte> want(rows * rb), got(rows * rb);
  for (int64_t r = 0; r < rows; ++r) {
    gguf_quantize_row(TensorType::Q4_0, std::span<const float>(x).subspan(r * cols, cols),
                      std::span<std::byte>(want).subspan(r * rb, rb));
  }
  gguf_quantize_rows(
      TensorType::Q4_0, rows, cols,
      [&](int64_t r, std::span<float> row) {
        std::copy_n(x.begin() + r * cols, cols, row.begin());
      },
      got);
  EXPECT_EQ(std::memcmp(want.data(), got.data(), want.size()), 0);
}

// Q4_0 as ggml's quantize_row_q4_0_ref writes it, one element at a time: the running strict
// "amax < |x|" picks the sign, truncation by the float-to-int conversion after std::trunc.
TEST(GgufQuants, Q4_0EqualsTheElementByElementReference) {
  const auto reference = [](const std::vector<float>& x) {
    std::vector<uint8_t> out;
    for (size_t b = 0; b < x.size() / 32; ++b) {
      const float* v = &x[b * 32];
      float amax = 0.0f, max = 0.0f;
      for (int j = 0; j < 32; ++j) {
        if (amax < std::fabs(v[j])) {
          amax = std::fabs(v[j]);
          max = v[j];
        }
      }
      const float d = max / -8.0f;
      const float id = d != 0.0f ? 1.0f / d : 0.0f;
      const uint16_t h = f32_to_f16(d);
      out.push_back(static_cast<uint8_t>(h & 0xff));
      out.push_back(static_cast<uint8_t>(h >> 8));
      uint8_t q[32];
      for (int j = 0; j < 32; ++j) {
        q[j] = static_cast<uint8_t>(
            std::clamp(static_cast<int>(std::trunc(v[j] * id + 8.5f)), 0, 15));
      }
      for (int j = 0; j < 16; ++j) out.push_back(static_cast<uint8_t>(q[j] | (q[j + 16] << 4)));
    }
    return out;
  };
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(32 * 64);
  for (float& v : x) v = normal(rng);
  for (int j = 0; j < 32; ++j) {
    x[j] = 0.0f;                       // block 0: all zero
    x[32 + j] = j % 2 ? -0.0f : 0.0f;  // block 1: signed zeros
    x[64 + j] = j == 3 ? 2.0f : 0.5f;  // block 2: one maximum
  }
  x[96 + 5] = -4.0f;  // block 3: the same magnitude twice, negative first
  x[96 + 9] = 4.0f;
  x[128 + 2] = std::nanf("");  // block 4: a NaN beside ordinary values
  x[160 + 1] = 1e-40f;         // block 5: a subnormal
  EXPECT_EQ(quantize(TensorType::Q4_0, x), reference(x));
}

// Q8_0's rounding (half away from zero, as ggml's roundf) on the values where it can go wrong:
// halves, just below halves, negative ones, and random blocks, against std::round.
TEST(GgufQuants, Q8_0RoundsAsStdRoundEverywhere) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> x(32 * 256);
  for (float& v : x) v = normal(rng);
  const float edges[] = {0.5f, -0.5f, 2.5f, -2.5f, 0.49999997f, -0.49999997f, 126.5f, -126.5f,
                         1.5f, -1.5f, 0.0f, -0.0f, 127.0f, -127.0f};
  for (size_t i = 0; i < std::size(edges); ++i) {  // d = 1 in block 0: q = round(x)
    x[i] = edges[i];
  }
  for (size_t i = std::size(edges); i < 32; ++i) x[i] = 0.25f;
  x[31] = 127.0f;
  const auto b = quantize(TensorType::Q8_0, x);
  for (size_t blk = 0; blk < x.size() / 32; ++blk) {
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[blk * 32 + j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int j = 0; j < 32; ++j) {
      const auto want = static_cast<int8_t>(std::round(x[blk * 32 + j] * id));
      ASSERT_EQ(static_cast<int8_t>(b[blk * 34 + 2 + j]), want) << blk << " " << j;
    }
  }
}
