#include "quant/weights/int4_group_quant.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "ir/half.h"
#include "kernels/cpu_threads_scope.h"
#include "kernels/int4.h"
#include "kernels/int4_math.h"

namespace qforge {
namespace {

// Normal values with the edge cases the scale rules treat apart: an all-zero group, a group of
// one repeated value, signed zeros, values too small for an fp16 scale, one near fp16's largest,
// a group whose extreme is negative.
std::vector<float> test_values(int64_t n, int64_t bs, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, 0.05f);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = dist(gen);
  const int64_t groups = n / bs;
  auto group = [&](int64_t g) { return v.begin() + g * bs; };
  if (groups > 1) std::fill(group(1), group(1) + bs, 0.0f);
  if (groups > 2) std::fill(group(2), group(2) + bs, -0.03125f);
  if (groups > 3) {
    for (int64_t i = 0; i < bs; ++i) v[static_cast<size_t>(3 * bs + i)] = i % 2 ? -0.0f : 1e-9f;
  }
  if (groups > 4) v[static_cast<size_t>(4 * bs)] = 60000.0f;
  if (groups > 5) v[static_cast<size_t>(5 * bs + bs / 2)] = -0.9f;
  return v;
}

// The bytes of the path the fused one replaces: the generic CPU kernel on the weight seen as
// [groups, bs] and transposed (each group a column), the fp16 scale stored in the weight's dtype
// (bf16: rounded, never to 0), codes recomputed from the stored scale.
struct Reference {
  std::vector<uint8_t> packed;
  std::vector<uint8_t> scale;
};

Reference reference(const Tensor& weight, int64_t bs, Int4Scale rule) {
  const std::vector<float> w = weight.to_f32();
  const auto n = static_cast<int64_t>(w.size());
  const int64_t groups = n / bs;
  std::vector<float> columns(w.size());
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t r = 0; r < bs; ++r) columns[static_cast<size_t>(r * groups + g)] = w[g * bs + r];
  std::vector<uint16_t> s16(static_cast<size_t>(groups));
  std::vector<uint8_t> unused(static_cast<size_t>(int4_packed_bytes(n)));
  quantize_int4_blocked(columns, bs, groups, bs, s16, unused, Device::Cpu, rule);
  Reference ref;
  std::vector<float> sf(s16.size());
  for (size_t g = 0; g < s16.size(); ++g) {
    if (weight.dtype() == DType::BF16) {
      uint16_t b = f32_to_bf16(f16_to_f32(s16[g]));
      if ((b & 0x7fff) == 0) b = static_cast<uint16_t>((b & 0x8000) | 1);
      sf[g] = bf16_to_f32(b);
      ref.scale.push_back(static_cast<uint8_t>(b));
      ref.scale.push_back(static_cast<uint8_t>(b >> 8));
    } else {
      sf[g] = f16_to_f32(s16[g]);
      uint8_t bytes[4];
      if (weight.dtype() == DType::F16) {
        std::memcpy(bytes, &s16[g], 2);
        ref.scale.insert(ref.scale.end(), bytes, bytes + 2);
      } else {
        std::memcpy(bytes, &sf[g], 4);
        ref.scale.insert(ref.scale.end(), bytes, bytes + 4);
      }
    }
  }
  std::vector<int8_t> q(w.size());
  for (int64_t i = 0; i < n; ++i) q[i] = int4_math::quantize_one(w[i], sf[i / bs]);
  ref.packed.resize(static_cast<size_t>(int4_packed_bytes(n)));
  pack_int4(q, ref.packed);
  return ref;
}

std::vector<uint8_t> bytes_of(const Tensor& t) {
  const auto b = t.bytes();
  std::vector<uint8_t> v(b.size());
  std::memcpy(v.data(), b.data(), b.size());
  return v;
}

std::string isa_name(Int4GroupIsa isa) {
  switch (isa) {
    case Int4GroupIsa::Base: return "base";
    case Int4GroupIsa::Avx2: return "avx2";
    case Int4GroupIsa::Avx512: return "avx512";
    case Int4GroupIsa::Best: break;
  }
  return "best";
}

TEST(Int4GroupQuant, SameBytesAsTheGenericKernelForEveryRuleDtypeShapeAndIsa) {
  struct Case {
    int64_t out, in, bs;
  };
  // Whole and partial chunks of 16 groups, odd group sizes, an odd element count.
  const Case cases[] = {{37, 256, 128}, {5, 96, 32}, {3, 6, 3}, {7, 9, 3}, {2, 64, 64},
                        {9, 320, 64}};
  uint32_t seed = 1;
  for (const Case& c : cases) {
    const auto w = test_values(c.out * c.in, c.bs, seed++);
    for (DType dtype : {DType::F32, DType::F16, DType::BF16}) {
      const Tensor weight = Tensor::from_f32(w, {c.out, c.in}, dtype);
      for (Int4Scale rule : {Int4Scale::Amax, Int4Scale::Mse}) {
        const Reference ref = reference(weight, c.bs, rule);
        for (Int4GroupIsa isa : {Int4GroupIsa::Base, Int4GroupIsa::Avx2, Int4GroupIsa::Avx512}) {
          if (!int4_group_isa_available(isa)) continue;
          const Int4GroupQuant got = quantize_int4_groups(weight, c.bs, rule, isa);
          std::ostringstream what;
          what << "[" << c.out << ", " << c.in << "] bs " << c.bs << " " << dtype_name(dtype)
               << " " << int4_scale_name(rule) << " " << isa_name(isa);
          ASSERT_TRUE(got.finite) << what.str();
          ASSERT_EQ(got.values.dtype(), DType::I4) << what.str();
          ASSERT_EQ(got.scale.shape(), (Shape{c.out, c.in / c.bs})) << what.str();
          EXPECT_EQ(bytes_of(got.values), ref.packed) << what.str();
          EXPECT_EQ(bytes_of(got.scale), ref.scale) << what.str();
        }
      }
    }
  }
}

// The search screens candidates with float sums and evaluates exactly only those the screen
// cannot rule out; the scales must still be the exact search's. Many groups of several kinds:
// Gaussian, heavy-tailed with outliers, values on a coarse grid (exact ties between codes and
// candidates whose errors are equal), tiny values (subnormal scales), and groups whose values
// are one repeated magnitude (several candidates with zero error).
std::vector<float> search_stress_values(int64_t n, int64_t bs, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  std::uniform_int_distribution<int> grid(-24, 24);
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t g = 0; g < n / bs; ++g) {
    const int kind = static_cast<int>(g % 5);
    for (int64_t r = 0; r < bs; ++r) {
      float x = 0.0f;
      switch (kind) {
        case 0: x = normal(gen); break;
        case 1: x = normal(gen) * (unit(gen) < 0.02f ? 40.0f : 1.0f); break;
        case 2: x = static_cast<float>(grid(gen)) * 0x1p-7f; break;
        case 3: x = normal(gen) * 1e-6f; break;
        default: x = (unit(gen) < 0.5f ? -1.0f : 1.0f) * 0.046875f; break;
      }
      v[static_cast<size_t>(g * bs + r)] = x;
    }
  }
  return v;
}

TEST(Int4GroupQuant, ScreenedSearchGivesTheExactSearchsScalesOnManyGroups) {
  uint32_t seed = 101;
  for (const int64_t bs : {16, 32, 128}) {
    const int64_t out = 40, in = 32 * bs;  // 1280 groups a case, 80 chunks
    const auto w = search_stress_values(out * in, bs, seed++);
    for (DType dtype : {DType::F32, DType::F16, DType::BF16}) {
      const Tensor weight = Tensor::from_f32(w, {out, in}, dtype);
      const Reference ref = reference(weight, bs, Int4Scale::Mse);
      for (Int4GroupIsa isa : {Int4GroupIsa::Base, Int4GroupIsa::Avx2, Int4GroupIsa::Avx512}) {
        if (!int4_group_isa_available(isa)) continue;
        const Int4GroupQuant got = quantize_int4_groups(weight, bs, Int4Scale::Mse, isa);
        const std::string what =
            "bs " + std::to_string(bs) + " " + std::string(dtype_name(dtype)) + " " + isa_name(isa);
        ASSERT_TRUE(got.finite) << what;
        EXPECT_EQ(bytes_of(got.scale), ref.scale) << what;
        EXPECT_EQ(bytes_of(got.values), ref.packed) << what;
      }
    }
  }
}

// The AVX-512 screen's codes come from round(w * fl(1 / s)), the exact search's from
// round(fl(w / s)). Next to every rounding boundary (w near (k + 1/2) s, within 40 ulps, for
// fp16 scales across their range, subnormal ones too), where the codes can differ, the two
// squared error terms stay within kInt4ScreenRho of each other, for the positive and the
// negative candidate. They do differ, by more than the float sums' own bound: a screen bound
// that ignored the reciprocal would not hold (here: about 4,900 differing codes, the largest
// factor 1 + 2^-17.8).
TEST(Int4GroupQuant, ReciprocalCodesStayWithinTheScreenBound) {
  std::mt19937 gen(5);
  std::uniform_int_distribution<int> scale_bits(1, 0x7bff), level(-9, 8);
  auto term = [](float w, float s, float c) {
    const float e = w - s * c;
    return static_cast<double>(e) * static_cast<double>(e);
  };
  int64_t differ = 0;
  double worst = 1.0;
  for (int t = 0; t < 20000; ++t) {
    const float s = f16_to_f32(static_cast<uint16_t>(scale_bits(gen)));
    const float boundary = (static_cast<float>(level(gen)) + 0.5f) * s;
    float w = boundary;
    for (int d = 0; d < 40; ++d) w = std::nextafter(w, -INFINITY);
    for (int d = -40; d <= 40; ++d, w = std::nextafter(w, INFINITY)) {
      for (const float sc : {s, -s}) {
        const auto exact = static_cast<float>(int4_math::quantize_one(w, sc));
        const float screen = std::min(std::max(std::nearbyint(w * (1.0f / sc)), -8.0f), 7.0f);
        if (exact == screen) continue;
        ++differ;
        const double a = term(w, sc, exact), b = term(w, sc, screen);
        ASSERT_GT(std::min(a, b), 0.0) << w << " / " << sc;
        worst = std::max(worst, std::max(a / b, b / a));
      }
    }
  }
  EXPECT_GT(differ, 1000);
  EXPECT_GT(worst, 1.0 + 0x1p-19);
  EXPECT_LE(worst, kInt4ScreenRho);
}

TEST(Int4GroupQuant, ErrorFiguresAreThoseOfTheStoredCodes) {
  const int64_t out = 6, in = 256, bs = 128;
  const auto w = test_values(out * in, bs, 7);
  const Tensor weight = Tensor::from_f32(w, {out, in}, DType::BF16);
  const Int4GroupQuant got = quantize_int4_groups(weight, bs, Int4Scale::Mse);
  const std::vector<float> wd = weight.to_f32(), s = got.scale.to_f32(), q = got.values.to_f32();
  double max_abs = 0, signal = 0, noise = 0;
  for (size_t i = 0; i < wd.size(); ++i) {
    const double e = static_cast<double>(wd[i]) - static_cast<double>(q[i] * s[i / bs]);
    max_abs = std::max(max_abs, std::abs(e));
    signal += static_cast<double>(wd[i]) * wd[i];
    noise += e * e;
  }
  EXPECT_EQ(got.max_abs_error, max_abs);
  // Summed per group, then over groups: equal to the plain sum up to rounding.
  EXPECT_NEAR(got.signal, signal, 1e-12 * signal);
  EXPECT_NEAR(got.noise, noise, 1e-12 * noise);
}

TEST(Int4GroupQuant, SameBytesAndFiguresAtAnyThreadCount) {
  const int64_t out = 96, in = 2048, bs = 128;  // above the one-thread size
  const Tensor weight = Tensor::from_f32(test_values(out * in, bs, 11), {out, in}, DType::BF16);
  std::vector<uint8_t> values, scale;
  double signal = 0, noise = 0;
  for (int threads : {1, 2, 3, 5}) {
    CpuThreadsScope scope(threads);
    const Int4GroupQuant got = quantize_int4_groups(weight, bs, Int4Scale::Mse);
    if (values.empty()) {
      values = bytes_of(got.values);
      scale = bytes_of(got.scale);
      signal = got.signal;
      noise = got.noise;
      continue;
    }
    EXPECT_EQ(bytes_of(got.values), values) << threads << " threads";
    EXPECT_EQ(bytes_of(got.scale), scale) << threads << " threads";
    EXPECT_EQ(got.signal, signal) << threads << " threads";
    EXPECT_EQ(got.noise, noise) << threads << " threads";
  }
}

TEST(Int4GroupQuant, NanOrInfIsReportedNotQuantized) {
  for (float bad : {std::nanf(""), INFINITY, -INFINITY}) {
    std::vector<float> w(2 * 64, 0.25f);
    w[70] = bad;
    const Tensor weight = Tensor::from_f32(w, {2, 64}, DType::F32);
    EXPECT_FALSE(quantize_int4_groups(weight, 32, Int4Scale::Mse).finite) << bad;
    EXPECT_FALSE(quantize_int4_groups(weight, 32, Int4Scale::Amax).finite) << bad;
  }
}

}  // namespace
}  // namespace qforge
