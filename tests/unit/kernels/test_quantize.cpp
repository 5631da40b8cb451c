#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "ir/error.h"
#include "kernels/quantize.h"
#include "tests/unit/cuda_test.h"

using namespace qforge;

namespace {

struct View {
  int64_t outer, channels, inner;
  [[nodiscard]] int64_t numel() const { return outer * channels * inner; }
  [[nodiscard]] std::string str() const {
    return "[outer " + std::to_string(outer) + ", channels " + std::to_string(channels) +
           ", inner " + std::to_string(inner) + "]";
  }
};

// Channel axis first, middle and last; sizes above the CPU kernels' parallel threshold whose
// rows do not line up with the 16384-element chunks; per-tensor (channels 1).
const std::vector<View> kViews = {
    {1, 8, 27},    {4, 5, 7},     {64, 16, 1},   {1, 1, 100003},
    {300, 301, 1}, {1, 3, 40001}, {7, 13, 1031}, {2, 1, 5},
};

// The CUDA kernels' other paths: more elements than one grid covers (kMaxGrid blocks of 256
// threads = 2^20), so grid-stride loops take a second and third pass; more channels than
// blocks in the grid (4096), so one block reduces several channels.
const std::vector<View> kCudaViews = {
    {1, 1, (int64_t{1} << 21) + 4099},
    {2, 4, (int64_t{1} << 19) + 3},
    {3, 5000, 7},
    {1, 9000, 1},
};

// Values spread differently per channel, so a wrong channel mapping changes the scales.
std::vector<float> random_input(const View& v, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(v.numel()));
  for (int64_t o = 0; o < v.outer; ++o)
    for (int64_t c = 0; c < v.channels; ++c)
      for (int64_t i = 0; i < v.inner; ++i)
        x[static_cast<size_t>((o * v.channels + c) * v.inner + i)] = dist(rng) * (1.0f + c % 7);
  return x;
}

// Plain scalar references, indexed the obvious way.
std::vector<float> ref_amax(const std::vector<float>& x, const View& v) {
  std::vector<float> m(static_cast<size_t>(v.channels), 0.0f);
  for (int64_t o = 0; o < v.outer; ++o)
    for (int64_t c = 0; c < v.channels; ++c)
      for (int64_t i = 0; i < v.inner; ++i)
        m[c] =
            std::max(m[c], std::fabs(x[static_cast<size_t>((o * v.channels + c) * v.inner + i)]));
  return m;
}

std::vector<int8_t> ref_quantize(const std::vector<float>& x, const View& v,
                                 const std::vector<float>& scales) {
  std::vector<int8_t> q(x.size());
  for (int64_t o = 0; o < v.outer; ++o)
    for (int64_t c = 0; c < v.channels; ++c)
      for (int64_t i = 0; i < v.inner; ++i) {
        const auto k = static_cast<size_t>((o * v.channels + c) * v.inner + i);
        const float r = std::nearbyint(x[k] / scales[c]);
        q[k] = static_cast<int8_t>(std::min(127.0f, std::max(-127.0f, r)));
      }
  return q;
}

std::vector<float> scales_for(const std::vector<float>& amax) {
  std::vector<float> s(amax.size());
  std::transform(amax.begin(), amax.end(), s.begin(), int8_symmetric_scale);
  return s;
}

struct Outputs {
  std::vector<float> amax;
  std::vector<int8_t> q;
  std::vector<float> deq;
};

Outputs run_all(const std::vector<float>& x, const View& v, Device device) {
  Outputs out;
  out.amax.resize(static_cast<size_t>(v.channels));
  amax_per_channel(x, v.outer, v.channels, v.inner, out.amax, device);
  const auto scales = scales_for(out.amax);
  out.q.resize(x.size());
  quantize_int8(x, v.outer, v.channels, v.inner, scales, out.q, device);
  out.deq.resize(x.size());
  dequantize_int8(out.q, v.outer, v.channels, v.inner, scales, out.deq, device);
  return out;
}

template <typename T>
bool same_bytes(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

int8_t quantize_scalar(float x, float scale) {
  int8_t q = 0;
  quantize_int8(std::span<const float>(&x, 1), 1, 1, 1, std::span<const float>(&scale, 1),
                std::span<int8_t>(&q, 1), Device::Cpu);
  return q;
}

class ThreadCount {  // restores the default on scope exit
 public:
  explicit ThreadCount(int n) { set_cpu_threads(n); }
  ~ThreadCount() { set_cpu_threads(0); }
};

}  // namespace

TEST(QuantizeInt8Cpu, MatchesScalarReference) {
  for (const View& v : kViews) {
    SCOPED_TRACE("view " + v.str());
    const auto x = random_input(v, 42);
    const Outputs got = run_all(x, v, Device::Cpu);
    EXPECT_EQ(got.amax, ref_amax(x, v));
    const auto scales = scales_for(ref_amax(x, v));
    EXPECT_TRUE(same_bytes(got.q, ref_quantize(x, v, scales)));
    for (size_t k = 0; k < x.size(); ++k) {
      const int64_t c = (static_cast<int64_t>(k) / v.inner) % v.channels;
      ASSERT_EQ(got.deq[k], static_cast<float>(got.q[k]) * scales[c]) << "element " << k;
      ASSERT_LE(std::fabs(got.deq[k] - x[k]), scales[c] * 0.5f * (1 + 1e-5f)) << "element " << k;
    }
  }
}

TEST(QuantizeInt8Cpu, PerTensorAmaxMatchesPerChannelMax) {
  for (const View& v : kViews) {
    const auto x = random_input(v, 7);
    const auto m = ref_amax(x, v);
    EXPECT_EQ(amax(x, Device::Cpu), *std::max_element(m.begin(), m.end())) << v.str();
  }
  EXPECT_EQ(amax({}, Device::Cpu), 0.0f);
}

TEST(QuantizeInt8Cpu, TiesRoundHalfToEven) {
  // x / scale lands exactly on k + 0.5 for these power-of-two scales.
  for (float scale : {1.0f, 0.25f, 0.0078125f}) {
    EXPECT_EQ(quantize_scalar(0.5f * scale, scale), 0);
    EXPECT_EQ(quantize_scalar(1.5f * scale, scale), 2);
    EXPECT_EQ(quantize_scalar(2.5f * scale, scale), 2);
    EXPECT_EQ(quantize_scalar(3.5f * scale, scale), 4);
    EXPECT_EQ(quantize_scalar(-0.5f * scale, scale), 0);
    EXPECT_EQ(quantize_scalar(-1.5f * scale, scale), -2);
    EXPECT_EQ(quantize_scalar(-2.5f * scale, scale), -2);
    EXPECT_EQ(quantize_scalar(125.5f * scale, scale), 126);
    EXPECT_EQ(quantize_scalar(126.5f * scale, scale), 126);
  }
  // Every tie in range, against the definition: the even neighbour.
  for (int k = -127; k < 127; ++k) {
    const float tie = static_cast<float>(k) + 0.5f;
    const int even = (k % 2 == 0) ? k : k + 1;
    EXPECT_EQ(quantize_scalar(tie, 1.0f), even) << "x = " << tie;
  }
}

TEST(QuantizeInt8Cpu, ClampsToSymmetricRange) {
  EXPECT_EQ(quantize_scalar(1000.0f, 1.0f), 127);
  EXPECT_EQ(quantize_scalar(-1000.0f, 1.0f), -127);
  EXPECT_EQ(quantize_scalar(127.5f, 1.0f), 127);    // would round to 128
  EXPECT_EQ(quantize_scalar(-127.5f, 1.0f), -127);  // would round to -128: never produced
  EXPECT_EQ(quantize_scalar(-128.0f, 1.0f), -127);
  EXPECT_EQ(quantize_scalar(std::numeric_limits<float>::infinity(), 1.0f), 127);
  EXPECT_EQ(quantize_scalar(-std::numeric_limits<float>::infinity(), 1.0f), -127);
  EXPECT_EQ(quantize_scalar(std::numeric_limits<float>::quiet_NaN(), 1.0f), 0);
}

TEST(QuantizeInt8Cpu, AllZeroChannelGetsScaleOneAndZeros) {
  const View v{3, 4, 5};
  auto x = random_input(v, 3);
  for (int64_t o = 0; o < v.outer; ++o)
    for (int64_t i = 0; i < v.inner; ++i)
      x[static_cast<size_t>((o * v.channels + 2) * v.inner + i)] = 0.0f;
  const Outputs got = run_all(x, v, Device::Cpu);
  EXPECT_EQ(got.amax[2], 0.0f);
  EXPECT_GT(got.amax[1], 0.0f);
  EXPECT_EQ(int8_symmetric_scale(got.amax[2]), 1.0f);
  for (int64_t o = 0; o < v.outer; ++o)
    for (int64_t i = 0; i < v.inner; ++i) {
      const auto k = static_cast<size_t>((o * v.channels + 2) * v.inner + i);
      EXPECT_EQ(got.q[k], 0);
      EXPECT_EQ(got.deq[k], 0.0f);
    }
}

TEST(QuantizeInt8Cpu, ScaleIsAmaxOver127AndAlwaysPositive) {
  EXPECT_EQ(int8_symmetric_scale(127.0f), 1.0f);
  EXPECT_EQ(int8_symmetric_scale(2.54f), 2.54f / 127.0f);
  EXPECT_EQ(int8_symmetric_scale(0.0f), 1.0f);
  EXPECT_GT(int8_symmetric_scale(std::numeric_limits<float>::denorm_min()), 0.0f);
  for (float bad : {-1.0f, std::numeric_limits<float>::infinity(), std::nanf("")}) {
    try {
      int8_symmetric_scale(bad);
      ADD_FAILURE() << "accepted amax " << bad;
    } catch (const Error& e) {
      EXPECT_EQ(e.category(), ErrorCategory::Internal);
    }
  }
}

TEST(QuantizeInt8Cpu, AmaxReportsNonFinite) {
  const View v{2, 3, 4};
  auto x = random_input(v, 5);
  x[static_cast<size_t>((1 * 3 + 1) * 4 + 2)] = std::numeric_limits<float>::infinity();
  std::vector<float> m(3);
  amax_per_channel(x, v.outer, v.channels, v.inner, m, Device::Cpu);
  EXPECT_TRUE(std::isfinite(m[0]));
  EXPECT_TRUE(std::isinf(m[1]));
  EXPECT_TRUE(std::isfinite(m[2]));
  EXPECT_TRUE(std::isinf(amax(x, Device::Cpu)));
  x[0] = -std::numeric_limits<float>::quiet_NaN();  // NaN outranks Inf, whatever its sign
  EXPECT_TRUE(std::isnan(amax(x, Device::Cpu)));
  amax_per_channel(x, v.outer, v.channels, v.inner, m, Device::Cpu);
  EXPECT_TRUE(std::isnan(m[0]));
}

TEST(QuantizeInt8Cpu, ThreadCountDoesNotChangeResults) {
  for (const View& v : kViews) {
    SCOPED_TRACE("view " + v.str());
    const auto x = random_input(v, 11);
    Outputs one, two;
    float amax_one = 0, amax_two = 0;
    {
      ThreadCount threads(1);
      one = run_all(x, v, Device::Cpu);
      amax_one = amax(x, Device::Cpu);
    }
    {
      ThreadCount threads(2);
      two = run_all(x, v, Device::Cpu);
      amax_two = amax(x, Device::Cpu);
    }
    EXPECT_TRUE(same_bytes(one.amax, two.amax));
    EXPECT_TRUE(same_bytes(one.q, two.q));
    EXPECT_TRUE(same_bytes(one.deq, two.deq));
    EXPECT_EQ(amax_one, amax_two);
  }
}

TEST(QuantizeInt8Cpu, MismatchedSizesAreInternalErrors) {
  std::vector<float> x(12), scales(3, 1.0f), m(3);
  std::vector<int8_t> q(12);
  auto category = [](auto&& fn) {
    try {
      fn();
    } catch (const Error& e) {
      return e.category();
    }
    return ErrorCategory::Usage;  // "nothing thrown": never expected below
  };
  EXPECT_EQ(category([&] { amax_per_channel(x, 1, 3, 5, m, Device::Cpu); }),
            ErrorCategory::Internal);
  EXPECT_EQ(category([&] { quantize_int8(x, 1, 4, 3, scales, q, Device::Cpu); }),
            ErrorCategory::Internal);
  scales[1] = 0.0f;
  EXPECT_EQ(category([&] { quantize_int8(x, 1, 3, 4, scales, q, Device::Cpu); }),
            ErrorCategory::Internal);
  EXPECT_EQ(category([&] { dequantize_int8(q, 2, 3, 4, scales, x, Device::Cpu); }),
            ErrorCategory::Internal);
}

TEST(QuantizeInt8Cuda, MatchesCpuTwinBitForBit) {
  QFORGE_NEEDS_CUDA_DEVICE("CUDA twin not run");
  std::vector<View> views = kViews;
  views.insert(views.end(), kCudaViews.begin(), kCudaViews.end());
  for (const View& v : views) {
    SCOPED_TRACE("view " + v.str());
    auto x = random_input(v, 99);
    x[x.size() / 2] = 2.5f * int8_symmetric_scale(ref_amax(x, v)[0]);  // a near-tie, for rounding
    const Outputs cpu = run_all(x, v, Device::Cpu);
    const Outputs gpu = run_all(x, v, Device::Cuda);
    EXPECT_TRUE(same_bytes(cpu.amax, gpu.amax));
    EXPECT_TRUE(same_bytes(cpu.q, gpu.q));
    EXPECT_TRUE(same_bytes(cpu.deq, gpu.deq));
    EXPECT_EQ(amax(x, Device::Cpu), amax(x, Device::Cuda));
  }
}

TEST(QuantizeInt8Cuda, TiesClampAndNonFiniteMatchCpu) {
  QFORGE_NEEDS_CUDA_DEVICE("CUDA twin not run");
  std::vector<float> x;
  for (int k = -130; k < 130; ++k) x.push_back(static_cast<float>(k) + 0.5f);
  x.push_back(std::numeric_limits<float>::infinity());
  x.push_back(-std::numeric_limits<float>::infinity());
  x.push_back(std::numeric_limits<float>::quiet_NaN());
  const std::vector<float> scale{1.0f};
  std::vector<int8_t> cpu(x.size()), gpu(x.size());
  const auto n = static_cast<int64_t>(x.size());
  quantize_int8(x, 1, 1, n, scale, cpu, Device::Cpu);
  quantize_int8(x, 1, 1, n, scale, gpu, Device::Cuda);
  EXPECT_TRUE(same_bytes(cpu, gpu));
  EXPECT_TRUE(std::isnan(amax(x, Device::Cuda)));
}
