// Int4Scale::Mse, the per-block scale search of kernels/int4.h, against its contract.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cli/option_parsers.h"
#include "ir/error.h"
#include "ir/half.h"
#include "kernels/int4.h"
#include "tests/unit/cuda_test.h"

using namespace qforge;

namespace {

struct Case {
  int64_t rows, cols, block;
  [[nodiscard]] std::string str() const {
    std::string s = "[";
    s += std::to_string(rows);
    s += ", ";
    s += std::to_string(cols);
    s += "] block ";
    s += std::to_string(block);
    return s;
  }
};

const Case kCases[] = {{64, 8, 32}, {100, 3, 32},    {7, 5, 4},      {130, 17, 64},
                       {1, 1, 128}, {512, 160, 128}, {300, 257, 128}};

std::vector<float> random_weight(const Case& c, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 0.3f);
  std::vector<float> w(static_cast<size_t>(c.rows * c.cols));
  for (float& v : w) v = dist(rng);
  return w;
}

struct Outputs {
  std::vector<uint16_t> scales;
  std::vector<uint8_t> packed;
  std::vector<float> deq;
};

Outputs run(const std::vector<float>& w, const Case& c, Device device, Int4Scale scale) {
  Outputs o;
  o.scales.resize(static_cast<size_t>(int4_block_count(c.rows, c.block) * c.cols));
  o.packed.resize(static_cast<size_t>(int4_packed_bytes(c.rows * c.cols)));
  o.deq.resize(w.size());
  quantize_int4_blocked(w, c.rows, c.cols, c.block, o.scales, o.packed, device, scale);
  dequantize_int4_blocked(o.packed, o.scales, c.rows, c.cols, c.block, o.deq, device);
  return o;
}

template <typename T>
bool same_bytes(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// Written from the contract, independent of the kernels' helpers.
uint16_t half_bits(float v) {
  uint16_t bits = f32_to_f16(v);
  if (bits == 0) bits = 1;
  if (bits >= 0x7c00) bits = 0x7bff;
  return bits;
}

// The candidates of step 1, in order: +m for every magnitude m, then -m for every m but the first.
std::vector<uint16_t> candidates(float amax) {
  if (amax == 0.0f) return std::vector<uint16_t>(23, f32_to_f16(1.0f));
  std::vector<uint16_t> magnitudes;
  for (float c : {1.00f, 0.98f, 0.96f, 0.94f, 0.92f, 0.90f, 0.88f, 0.86f, 0.84f, 0.82f, 0.80f})
    magnitudes.push_back(half_bits((amax * c) / 7.0f));
  magnitudes.push_back(half_bits(amax / 8.0f));
  std::vector<uint16_t> out = magnitudes;
  for (size_t m = 1; m < magnitudes.size(); ++m)
    out.push_back(static_cast<uint16_t>(magnitudes[m] | 0x8000));
  return out;
}

// sum over rows [r0, r1) of column `col` of (w - s * q(w / s))^2, in double.
double block_error(const std::vector<float>& w, const Case& c, int64_t r0, int64_t r1, int64_t col,
                   uint16_t scale_bits) {
  const double s = f16_to_f32(scale_bits);
  double e = 0.0;
  for (int64_t r = r0; r < r1; ++r) {
    const float x = w[static_cast<size_t>(r * c.cols + col)];
    const float q = std::clamp(std::nearbyint(x / static_cast<float>(s)), -8.0f, 7.0f);
    const double d = static_cast<double>(x) - s * q;
    e += d * d;
  }
  return e;
}

// The whole search of the contract for one block column, written from kernels/int4.h.
uint16_t reference_search(const std::vector<float>& w, const Case& c, int64_t r0, int64_t r1,
                          int64_t col) {
  float amax = 0.0f;
  for (int64_t r = r0; r < r1; ++r)
    amax = std::max(amax, std::fabs(w[static_cast<size_t>(r * c.cols + col)]));
  uint16_t chosen = 0;
  double best = 0.0;
  for (uint16_t s : candidates(amax)) {
    const double e = block_error(w, c, r0, r1, col, s);
    if (chosen == 0 || e < best) {
      best = e;
      chosen = s;
    }
  }
  for (int round = 0; round < 2; ++round) {
    const float s = f16_to_f32(chosen);
    double wq = 0.0, qq = 0.0;
    for (int64_t r = r0; r < r1; ++r) {
      const float x = w[static_cast<size_t>(r * c.cols + col)];
      const float q = std::clamp(std::nearbyint(x / s), -8.0f, 7.0f);
      wq += static_cast<double>(x) * q;
      qq += static_cast<double>(q) * q;
    }
    if (qq == 0.0) break;
    uint16_t next = f32_to_f16(static_cast<float>(wq / qq));
    if ((next & 0x7fff) == 0) next |= 1;
    if ((next & 0x7fff) >= 0x7c00) next = static_cast<uint16_t>((next & 0x8000) | 0x7bff);
    if (next == chosen) break;
    const double e = block_error(w, c, r0, r1, col, next);
    if (!(e < best)) break;
    best = e;
    chosen = next;
  }
  return chosen;
}

// ONNX Runtime's MatMulNBitsQuantizer, symmetric (MLAS blockwise quantization): the signed
// extreme maps to -8, scale = extreme / -8 in f32, q = clamp(round(w / scale) + 8, 0, 15) - 8.
double ort_rtn_block_error(const std::vector<float>& w, const Case& c, int64_t r0, int64_t r1,
                           int64_t col) {
  float lo = 0.0f, hi = 0.0f;
  for (int64_t r = r0; r < r1; ++r) {
    lo = std::min(lo, w[static_cast<size_t>(r * c.cols + col)]);
    hi = std::max(hi, w[static_cast<size_t>(r * c.cols + col)]);
  }
  const float extreme = std::fabs(hi) > std::fabs(lo) ? hi : lo;
  const float scale = extreme / -8.0f;
  const float inverse = scale != 0.0f ? 1.0f / scale : 0.0f;
  double e = 0.0;
  for (int64_t r = r0; r < r1; ++r) {
    const float x = w[static_cast<size_t>(r * c.cols + col)];
    const float q = std::clamp(std::round(x * inverse) + 8.0f, 0.0f, 15.0f) - 8.0f;
    const double d = static_cast<double>(x) - static_cast<double>(scale) * q;
    e += d * d;
  }
  return e;
}

class ThreadCount {  // restores the default on scope exit
 public:
  explicit ThreadCount(int n) { set_cpu_threads(n); }
  ~ThreadCount() { set_cpu_threads(0); }
};

}  // namespace

// The kernel's scales are the contract's, bit for bit; each block's error is at most every
// candidate's (a refined scale, not a candidate, only when strictly below all of them), so never
// above amax / 7's; and the codes follow the scale.
TEST(Int4ScaleSearch, MatchesTheContractAndNeverLosesToACandidate) {
  double total_mse = 0.0, total_amax = 0.0;
  int refined = 0, negative = 0;
  for (const Case& c : kCases) {
    SCOPED_TRACE("case " + c.str());
    const auto w = random_weight(c, 42);
    const Outputs mse = run(w, c, Device::Cpu, Int4Scale::Mse);
    const Outputs amax = run(w, c, Device::Cpu, Int4Scale::Amax);
    const int64_t blocks = int4_block_count(c.rows, c.block);
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t r0 = b * c.block, r1 = std::min(c.rows, r0 + c.block);
      for (int64_t col = 0; col < c.cols; ++col) {
        float a = 0.0f;
        for (int64_t r = r0; r < r1; ++r)
          a = std::max(a, std::fabs(w[static_cast<size_t>(r * c.cols + col)]));
        const std::vector<uint16_t> cand = candidates(a);
        const uint16_t chosen = mse.scales[static_cast<size_t>(b * c.cols + col)];
        ASSERT_EQ(chosen, reference_search(w, c, r0, r1, col))
            << "block " << b << " column " << col << " amax " << a;
        ASSERT_EQ(amax.scales[static_cast<size_t>(b * c.cols + col)], cand[0]);
        const double e = block_error(w, c, r0, r1, col, chosen);
        const bool is_candidate = std::find(cand.begin(), cand.end(), chosen) != cand.end();
        for (uint16_t s : cand) {
          const double ec = block_error(w, c, r0, r1, col, s);
          if (is_candidate) {
            ASSERT_LE(e, ec * (1 + 1e-12)) << "block " << b << " column " << col;
          } else {
            ASSERT_LT(e, ec) << "refined scale not below candidate, block " << b;
          }
        }
        refined += is_candidate ? 0 : 1;
        negative += (chosen & 0x8000) != 0 ? 1 : 0;
        total_mse += e;
        total_amax += block_error(w, c, r0, r1, col, cand[0]);
      }
    }
    for (int64_t r = 0; r < c.rows; ++r)
      for (int64_t col = 0; col < c.cols; ++col) {
        const auto e = static_cast<size_t>(r * c.cols + col);
        const float s = f16_to_f32(mse.scales[static_cast<size_t>((r / c.block) * c.cols + col)]);
        ASSERT_EQ(mse.deq[e], std::clamp(std::nearbyint(w[e] / s), -8.0f, 7.0f) * s);
      }
  }
  // On Gaussian weights both new steps are used, and the search is a real gain over amax / 7.
  EXPECT_GT(refined, 0);
  EXPECT_GT(negative, 0);
  EXPECT_LT(total_mse, 0.9 * total_amax) << total_mse << " vs " << total_amax;
}

// ONNX Runtime's RTN uses one of the candidates, up to the fp16 rounding of its f32 scale: per
// block the search is never worse than that scale in fp16, and in total it is below ONNX
// Runtime's own f32-scaled result.
TEST(Int4ScaleSearch, NeverLosesToOnnxRuntimesRtn) {
  double total_mse = 0.0, total_ort = 0.0;
  for (const Case& c : kCases) {
    SCOPED_TRACE("case " + c.str());
    const auto w = random_weight(c, 5);
    const Outputs mse = run(w, c, Device::Cpu, Int4Scale::Mse);
    const int64_t blocks = int4_block_count(c.rows, c.block);
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t r0 = b * c.block, r1 = std::min(c.rows, r0 + c.block);
      for (int64_t col = 0; col < c.cols; ++col) {
        float lo = 0.0f, hi = 0.0f;
        for (int64_t r = r0; r < r1; ++r) {
          lo = std::min(lo, w[static_cast<size_t>(r * c.cols + col)]);
          hi = std::max(hi, w[static_cast<size_t>(r * c.cols + col)]);
        }
        const float extreme = std::fabs(hi) > std::fabs(lo) ? hi : lo;
        const uint16_t ort_f16 = half_bits(extreme / -8.0f);
        const uint16_t chosen = mse.scales[static_cast<size_t>(b * c.cols + col)];
        const double e = block_error(w, c, r0, r1, col, chosen);
        ASSERT_LE(e, block_error(w, c, r0, r1, col, ort_f16) * (1 + 1e-12))
            << "block " << b << " column " << col;
        total_mse += e;
        total_ort += ort_rtn_block_error(w, c, r0, r1, col);
      }
    }
  }
  EXPECT_LT(total_mse, total_ort) << total_mse << " vs " << total_ort;
}

TEST(Int4ScaleSearch, NegativeExtremeTakesTheFullRangeMapping) {
  // Multiples of 1/8 in [-8/8, 7/8] with the extreme -1: amax / 8 = 0.125 is lossless.
  const std::vector<float> w = {-1.0f, 0.875f, 0.25f, -0.5f, 0.125f, 0.0f, -0.375f, 0.625f};
  const Case c{8, 1, 8};
  const Outputs out = run(w, c, Device::Cpu, Int4Scale::Mse);
  EXPECT_EQ(out.scales[0], f32_to_f16(0.125f));
  EXPECT_EQ(out.deq, w);
  // amax / 7 would have kept the extreme but not the rest.
  EXPECT_NE(run(w, c, Device::Cpu, Int4Scale::Amax).deq, w);

  // Mirrored, the extreme is +1: a negative scale -0.125 maps it to -8 and is lossless too.
  std::vector<float> mirrored(w.size());
  std::transform(w.begin(), w.end(), mirrored.begin(), [](float v) { return -v; });
  const Outputs m = run(mirrored, c, Device::Cpu, Int4Scale::Mse);
  EXPECT_EQ(m.scales[0], f32_to_f16(-0.125f));
  EXPECT_EQ(m.deq, mirrored);
}

TEST(Int4ScaleSearch, LeastSquaresRefinementFindsAScaleOffTheGrid) {
  // Codes {7, -6, 4, 1, -2, 5, 0, -1} times 0.0833, the 7 stretched by 2%: no grid candidate
  // fits (the best, 0.98 amax / 7 = 0.0833, leaves 1.4e-4); the least-squares scale of its codes,
  // fp16 0.0839, leaves 8.6e-5.
  const float step = 0.0833f;
  std::vector<float> w;
  for (float q : {7.0f, -6.0f, 4.0f, 1.0f, -2.0f, 5.0f, 0.0f, -1.0f}) w.push_back(q * step);
  w[0] = 7.0f * step * 1.02f;
  const Case c{8, 1, 8};
  const Outputs out = run(w, c, Device::Cpu, Int4Scale::Mse);
  const std::vector<uint16_t> cand = candidates(w[0]);
  EXPECT_EQ(std::find(cand.begin(), cand.end(), out.scales[0]), cand.end())
      << "scale bits " << out.scales[0] << " is a grid candidate";
  const double e = block_error(w, c, 0, 8, 0, out.scales[0]);
  for (uint16_t s : cand) EXPECT_LT(e, block_error(w, c, 0, 8, 0, s)) << "candidate " << s;
}

TEST(Int4ScaleSearch, TiesKeepAmaxOverSeven) {
  // Integers with amax 7: scale 1 is lossless, so no later candidate can be strictly better.
  const std::vector<float> w = {7.0f, -7.0f, 3.0f, -2.0f, 0.0f, 1.0f, 6.0f, -5.0f};
  const Outputs out = run(w, Case{8, 1, 8}, Device::Cpu, Int4Scale::Mse);
  EXPECT_EQ(out.scales[0], f32_to_f16(1.0f));
  EXPECT_EQ(out.deq, w);
  // All-zero block: every candidate is 1.0.
  const Outputs zero = run(std::vector<float>(8, 0.0f), Case{8, 1, 8}, Device::Cpu, Int4Scale::Mse);
  EXPECT_EQ(zero.scales[0], f32_to_f16(1.0f));
}

TEST(Int4ScaleSearch, ThreadCountDoesNotChangeResults) {
  for (const Case& c : kCases) {
    SCOPED_TRACE("case " + c.str());
    const auto w = random_weight(c, 7);
    Outputs one, two;
    {
      ThreadCount threads(1);
      one = run(w, c, Device::Cpu, Int4Scale::Mse);
    }
    {
      ThreadCount threads(2);
      two = run(w, c, Device::Cpu, Int4Scale::Mse);
    }
    EXPECT_TRUE(same_bytes(one.scales, two.scales));
    EXPECT_TRUE(same_bytes(one.packed, two.packed));
  }
}

TEST(Int4ScaleSearch, NamesParseAndUnknownIsUsageError) {
  EXPECT_EQ(parse_int4_scale("mse"), Int4Scale::Mse);
  EXPECT_EQ(parse_int4_scale("amax"), Int4Scale::Amax);
  EXPECT_EQ(int4_scale_name(Int4Scale::Mse), "mse");
  EXPECT_EQ(int4_scale_name(Int4Scale::Amax), "amax");
  try {
    (void)parse_int4_scale("best");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), ErrorCategory::Usage) << e.what();
  }
}

TEST(Int4ScaleSearchCuda, MatchesCpuTwinBitForBit) {
  QFORGE_NEEDS_CUDA_DEVICE("CUDA twin of the int4 scale search not run");
  for (const Case& c : kCases) {
    SCOPED_TRACE("case " + c.str());
    auto w = random_weight(c, 99);
    w[0] = 1.0e6f;                                      // overflowing scale and clamping
    w[w.size() / 2] = 1.0e-30f;                         // tiny values next to normal ones
    if (w.size() > 2) w[w.size() - 1] = std::nanf("");  // NaN quantizes to 0
    const Outputs cpu = run(w, c, Device::Cpu, Int4Scale::Mse);
    const Outputs gpu = run(w, c, Device::Cuda, Int4Scale::Mse);
    EXPECT_TRUE(same_bytes(cpu.scales, gpu.scales));
    EXPECT_TRUE(same_bytes(cpu.packed, gpu.packed));
  }
  // A block of subnormal-sized weights (scales at fp16's smallest).
  std::vector<float> tiny(64);
  for (size_t i = 0; i < tiny.size(); ++i) tiny[i] = static_cast<float>(i) * 3.0e-9f - 1.0e-7f;
  const Case t{16, 4, 8};
  EXPECT_TRUE(same_bytes(run(tiny, t, Device::Cpu, Int4Scale::Mse).scales,
                         run(tiny, t, Device::Cuda, Int4Scale::Mse).scales));
}
