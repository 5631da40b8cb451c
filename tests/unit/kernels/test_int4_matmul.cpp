#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ir/error.h"
#include "ir/half.h"
#include "kernels/cpu/int4_matmul_cpu.h"
#include "kernels/device.h"
#include "kernels/int4.h"
#include "kernels/int4_matmul.h"
#include "tests/unit/cuda_test.h"

using namespace qforge;

namespace {

struct Shape3 {
  int64_t m, k, n, block;
};

// K not a multiple of the block, odd N, M = 1 / 16 / 33, N wider than one CPU tile.
const Shape3 kShapes[] = {
    {1, 100, 7, 32},    {16, 100, 7, 32}, {33, 100, 7, 32},   {1, 257, 131, 64}, {16, 64, 96, 16},
    {33, 300, 65, 128}, {3, 5, 1, 2},     {16, 384, 200, 32}, {2, 130, 192, 64}, {5, 96, 150, 32}};

struct Quantized {
  std::vector<uint8_t> packed;
  std::vector<uint16_t> scales;
  std::vector<int8_t> zeros;
};

Quantized quantize(const Shape3& s, uint32_t seed, bool with_zeros) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 0.5f);
  std::vector<float> w(static_cast<size_t>(s.k * s.n));
  for (float& v : w) v = dist(rng);
  Quantized q;
  q.scales.resize(static_cast<size_t>(int4_block_count(s.k, s.block) * s.n));
  q.packed.resize(static_cast<size_t>(int4_packed_bytes(s.k * s.n)));
  quantize_int4_blocked(w, s.k, s.n, s.block, q.scales, q.packed, Device::Cpu);
  if (with_zeros) {
    std::uniform_int_distribution<int> z(-8, 7);
    q.zeros.resize(q.scales.size());
    for (int8_t& v : q.zeros) v = static_cast<int8_t>(z(rng));
  }
  return q;
}

Int4Weight view(const Quantized& q, const Shape3& s) {
  return Int4Weight{.packed = q.packed,
                    .scales_f16 = q.scales,
                    .scales_f32 = {},
                    .zero_points = q.zeros,
                    .k = s.k,
                    .n = s.n,
                    .block_size = s.block};
}

// The whole weight dequantized by the int4 kernel (symmetric), then zero points applied here.
std::vector<float> dequantized(const Quantized& q, const Shape3& s) {
  std::vector<float> w(static_cast<size_t>(s.k * s.n));
  dequantize_int4_blocked(q.packed, q.scales, s.k, s.n, s.block, w, Device::Cpu);
  if (!q.zeros.empty()) {
    for (int64_t r = 0; r < s.k; ++r) {
      for (int64_t c = 0; c < s.n; ++c) {
        const auto b = static_cast<size_t>((r / s.block) * s.n + c);
        w[static_cast<size_t>(r * s.n + c)] -=
            static_cast<float>(q.zeros[b]) * f16_to_f32(q.scales[b]);
      }
    }
  }
  return w;
}

std::vector<float> random_x(const Shape3& s, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(s.m * s.k));
  for (float& v : x) v = dist(rng);
  return x;
}

// Plain matmul on the dequantized weight: f32 in k order (the kernel's contract, so equal bits)
// and a double sum with its magnitude (for the error bound).
struct Ref {
  std::vector<float> f32;
  std::vector<double> f64, mag;
};

Ref reference(const std::vector<float>& x, const std::vector<float>& w, const Shape3& s) {
  Ref r;
  r.f32.resize(static_cast<size_t>(s.m * s.n));
  r.f64.resize(r.f32.size());
  r.mag.resize(r.f32.size());
  for (int64_t i = 0; i < s.m; ++i) {
    for (int64_t c = 0; c < s.n; ++c) {
      float acc = 0.0f;
      double acc64 = 0.0, mag = 0.0;
      for (int64_t kk = 0; kk < s.k; ++kk) {
        const float a = x[static_cast<size_t>(i * s.k + kk)];
        const float b = w[static_cast<size_t>(kk * s.n + c)];
        const float p = a * b;
        acc = acc + p;
        acc64 += static_cast<double>(a) * b;
        mag += std::fabs(static_cast<double>(a) * b);
      }
      const auto o = static_cast<size_t>(i * s.n + c);
      r.f32[o] = acc;
      r.f64[o] = acc64;
      r.mag[o] = mag;
    }
  }
  return r;
}

std::string name(const Shape3& s) {
  std::string t = "M ";
  t += std::to_string(s.m);
  t += " K ";
  t += std::to_string(s.k);
  t += " N ";
  t += std::to_string(s.n);
  t += " block ";
  t += std::to_string(s.block);
  return t;
}

class Int4MatmulCpu : public ::testing::TestWithParam<bool> {};  // with zero points?

}  // namespace

TEST_P(Int4MatmulCpu, MatchesDequantizeThenMatmul) {
  const bool zeros = GetParam();
  for (const Shape3& s : kShapes) {
    SCOPED_TRACE(name(s));
    const Quantized q = quantize(s, 7, zeros);
    const std::vector<float> x = random_x(s, 11);
    const Ref ref = reference(x, dequantized(q, s), s);
    std::vector<float> y(static_cast<size_t>(s.m * s.n), NAN);
    int4_matmul(x, s.m, view(q, s), y, Device::Cpu);
    // The baseline (SSE2) build too, where the dispatch runs the AVX2 one: the same bits.
    std::vector<float> base(y.size(), NAN);
    cpu::int4_matmul(x.data(), s.m, view(q, s), base.data(), 1, /*allow_avx2=*/false);
    for (size_t i = 0; i < y.size(); ++i) {
      ASSERT_EQ(std::memcmp(&y[i], &ref.f32[i], 4), 0)
          << "element " << i << ": " << y[i] << " vs " << ref.f32[i];
      ASSERT_EQ(std::memcmp(&base[i], &ref.f32[i], 4), 0)
          << "baseline build, element " << i << ": " << base[i] << " vs " << ref.f32[i];
      ASSERT_NEAR(y[i], ref.f64[i], 1e-6 * ref.mag[i] + 1e-30) << "element " << i;
    }
  }
}

TEST_P(Int4MatmulCpu, F16ActivationsAndF32ScalesAgree) {
  const bool zeros = GetParam();
  const Shape3 s{16, 257, 131, 64};
  const Quantized q = quantize(s, 3, zeros);
  std::vector<float> x = random_x(s, 5);
  std::vector<uint16_t> xh(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    xh[i] = f32_to_f16(x[i]);
    x[i] = f16_to_f32(xh[i]);  // the same values in f32
  }
  std::vector<float> scales32(q.scales.size());
  for (size_t i = 0; i < scales32.size(); ++i) scales32[i] = f16_to_f32(q.scales[i]);
  Int4Weight w32 = view(q, s);
  w32.scales_f16 = {};
  w32.scales_f32 = scales32;
  std::vector<float> a(static_cast<size_t>(s.m * s.n)), b(a.size()), c(a.size());
  int4_matmul(x, s.m, view(q, s), a, Device::Cpu);
  int4_matmul_f16(xh, s.m, view(q, s), b, Device::Cpu);
  int4_matmul(x, s.m, w32, c, Device::Cpu);
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0);
  EXPECT_EQ(std::memcmp(a.data(), c.data(), a.size() * 4), 0);
}

TEST_P(Int4MatmulCpu, BytesDoNotDependOnThreads) {
  const Shape3 s{33, 300, 1000, 128};  // 16 tiles of N, enough work for every thread
  const Quantized q = quantize(s, 9, GetParam());
  const std::vector<float> x = random_x(s, 13);
  const int before = cpu_threads();
  std::vector<float> one(static_cast<size_t>(s.m * s.n)), many(one.size());
  set_cpu_threads(1);
  int4_matmul(x, s.m, view(q, s), one, Device::Cpu);
  set_cpu_threads(4);
  int4_matmul(x, s.m, view(q, s), many, Device::Cpu);
  set_cpu_threads(before);
  EXPECT_EQ(std::memcmp(one.data(), many.data(), one.size() * 4), 0);
}

INSTANTIATE_TEST_SUITE_P(ZeroPoints, Int4MatmulCpu, ::testing::Values(false, true));

TEST(Int4Matmul, SizeMismatchIsInternal) {
  const Shape3 s{2, 64, 8, 32};
  const Quantized q = quantize(s, 1, false);
  std::vector<float> x(static_cast<size_t>(s.m * s.k)), y(static_cast<size_t>(s.m * s.n) + 1);
  try {
    int4_matmul(x, s.m, view(q, s), y, Device::Cpu);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), ErrorCategory::Internal);
    EXPECT_NE(std::string(e.what()).find("y has"), std::string::npos) << e.what();
  }
}

TEST(Int4MatmulCuda, MatchesCpu) {
  QFORGE_NEEDS_CUDA_DEVICE("CUDA W4A16 matmul not compared");
  std::vector<Shape3> shapes(std::begin(kShapes), std::end(kShapes));
  // A decoder's shapes: M = 1 with K = N = 4096 takes the GEMV kernel's 32-bit weight loads and
  // splits K over the grid (one tile of N per 256 columns would leave the SMs idle); M = 3 the
  // small-M kernel over a long K.
  shapes.push_back({1, 4096, 4096, 128});
  shapes.push_back({1, 4096, 4096, 32});
  shapes.push_back({3, 4096, 520, 64});
  for (const bool zeros : {false, true}) {
    for (const Shape3& s : shapes) {
      SCOPED_TRACE(name(s) + (zeros ? " with zero points" : ""));
      const Quantized q = quantize(s, 21, zeros);
      std::vector<float> x = random_x(s, 23);
      std::vector<uint16_t> xh(x.size());
      for (size_t i = 0; i < x.size(); ++i) {
        xh[i] = f32_to_f16(x[i]);
        x[i] = f16_to_f32(xh[i]);
      }
      const Ref ref = reference(x, dequantized(q, s), s);
      std::vector<float> cpu(static_cast<size_t>(s.m * s.n)), gpu(cpu.size()), gpu32(cpu.size());
      int4_matmul(x, s.m, view(q, s), cpu, Device::Cpu);
      int4_matmul_f16(xh, s.m, view(q, s), gpu, Device::Cuda);
      int4_matmul(x, s.m, view(q, s), gpu32, Device::Cuda);
      // Two f32 sums of the same K products in different orders: each within K units of
      // rounding of the sum of magnitudes.
      const double rel = std::max(1e-5, 2.0 * static_cast<double>(s.k) * 0x1p-24);
      for (size_t i = 0; i < cpu.size(); ++i) {
        ASSERT_NEAR(gpu[i], cpu[i], rel * ref.mag[i] + 1e-30) << "element " << i;
        ASSERT_NEAR(gpu32[i], cpu[i], rel * ref.mag[i] + 1e-30) << "element " << i;
      }
      // Deterministic: a second run gives the same bits.
      std::vector<float> again(cpu.size());
      int4_matmul_f16(xh, s.m, view(q, s), again, Device::Cuda);
      ASSERT_EQ(std::memcmp(gpu.data(), again.data(), gpu.size() * 4), 0);
    }
  }
}
