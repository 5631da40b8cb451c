#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ir/error.h"
#include "ir/half.h"
#include "kernels/int4.h"
#include "tests/unit/cuda_test.h"

using namespace qforge;

namespace {

struct Case {
  int64_t rows, cols, block;
  [[nodiscard]] std::string str() const {
    std::string s = "[";  // appended piece by piece: GCC 12 -Wrestrict misfires on "..." + s
    s += std::to_string(rows);
    s += ", ";
    s += std::to_string(cols);
    s += "] block ";
    s += std::to_string(block);
    return s;
  }
};

// Exact blocks, a partial last block, odd element counts, and one large enough for threads.
const Case kCases[] = {{64, 8, 32}, {100, 3, 32},    {7, 5, 4},      {130, 17, 64},
                       {1, 1, 128}, {512, 160, 128}, {300, 257, 128}};

std::vector<float> random_weight(const Case& c, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 0.3f);
  std::vector<float> w(static_cast<size_t>(c.rows * c.cols));
  for (float& v : w) v = dist(rng);
  return w;
}

// Scalar reference written from the contract, independent of the kernels' helpers.
struct Reference {
  std::vector<uint16_t> scales;
  std::vector<int8_t> q;
  std::vector<float> deq;
};

Reference reference(const std::vector<float>& w, const Case& c) {
  const int64_t blocks = (c.rows + c.block - 1) / c.block;
  Reference r;
  r.scales.resize(static_cast<size_t>(blocks * c.cols));
  r.q.resize(w.size());
  r.deq.resize(w.size());
  for (int64_t b = 0; b < blocks; ++b) {
    for (int64_t col = 0; col < c.cols; ++col) {
      float amax = 0.0f;
      for (int64_t row = b * c.block; row < std::min(c.rows, (b + 1) * c.block); ++row)
        amax = std::max(amax, std::fabs(w[static_cast<size_t>(row * c.cols + col)]));
      uint16_t bits = amax == 0.0f ? f32_to_f16(1.0f) : f32_to_f16(amax / 7.0f);
      if (bits == 0) bits = 1;
      if (bits >= 0x7c00) bits = 0x7bff;
      r.scales[static_cast<size_t>(b * c.cols + col)] = bits;
    }
  }
  for (int64_t row = 0; row < c.rows; ++row) {
    for (int64_t col = 0; col < c.cols; ++col) {
      const auto e = static_cast<size_t>(row * c.cols + col);
      const float s = f16_to_f32(r.scales[static_cast<size_t>((row / c.block) * c.cols + col)]);
      const float v = std::nearbyint(w[e] / s);
      r.q[e] = static_cast<int8_t>(std::clamp(v, -8.0f, 7.0f));
      r.deq[e] = static_cast<float>(r.q[e]) * s;
    }
  }
  return r;
}

std::vector<uint8_t> reference_pack(const std::vector<int8_t>& q) {
  std::vector<uint8_t> p((q.size() + 1) / 2, 0);
  for (size_t i = 0; i < q.size(); ++i)
    p[i / 2] = static_cast<uint8_t>(p[i / 2] | ((static_cast<uint8_t>(q[i]) & 0xf) << (i % 2 * 4)));
  return p;
}

struct Outputs {
  std::vector<uint16_t> scales;
  std::vector<uint8_t> packed;
  std::vector<float> deq;
};

Outputs run(const std::vector<float>& w, const Case& c, Device device) {
  Outputs o;
  o.scales.resize(static_cast<size_t>(int4_block_count(c.rows, c.block) * c.cols));
  o.packed.resize(static_cast<size_t>(int4_packed_bytes(c.rows * c.cols)));
  o.deq.resize(w.size());
  quantize_int4_blocked(w, c.rows, c.cols, c.block, o.scales, o.packed, device);
  dequantize_int4_blocked(o.packed, o.scales, c.rows, c.cols, c.block, o.deq, device);
  return o;
}

template <typename T>
bool same_bytes(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

class ThreadCount {  // restores the default on scope exit
 public:
  explicit ThreadCount(int n) { set_cpu_threads(n); }
  ~ThreadCount() { set_cpu_threads(0); }
};

}  // namespace

TEST(Int4Cpu, MatchesScalarReference) {
  for (const Case& c : kCases) {
    SCOPED_TRACE("case " + c.str());
    const auto w = random_weight(c, 42);
    const Reference ref = reference(w, c);
    const Outputs out = run(w, c, Device::Cpu);
    EXPECT_TRUE(same_bytes(out.scales, ref.scales));
    EXPECT_TRUE(same_bytes(out.packed, reference_pack(ref.q)));
    EXPECT_TRUE(same_bytes(out.deq, ref.deq));
  }
}

TEST(Int4Cpu, TiesRoundHalfToEven) {
  // One column with amax 7: the scale is exactly 1, so w / scale is w.
  const std::vector<float> w = {7.0f, 0.5f, 1.5f, 2.5f, -0.5f, -1.5f, -2.5f, 6.5f};
  const Case c{8, 1, 8};
  const Outputs out = run(w, c, Device::Cpu);
  ASSERT_EQ(out.scales[0], f32_to_f16(1.0f));
  std::vector<int8_t> q(8);
  unpack_int4(out.packed, q);
  EXPECT_EQ(q, (std::vector<int8_t>{7, 0, 2, 2, 0, -2, -2, 6}));
}

TEST(Int4Cpu, ScaleOverflowClampsToLargestHalfAndValuesToRange) {
  // amax / 7 does not fit fp16: the scale is 65504 and the values clamp to [-8, 7].
  const std::vector<float> w = {1.0e6f, -1.0e6f, 65504.0f * 3.0f, 0.0f};
  const Case c{4, 1, 4};
  const Outputs out = run(w, c, Device::Cpu);
  EXPECT_EQ(out.scales[0], 0x7bff);
  std::vector<int8_t> q(4);
  unpack_int4(out.packed, q);
  EXPECT_EQ(q, (std::vector<int8_t>{7, -8, 3, 0}));
}

TEST(Int4Cpu, NaNQuantizesToZeroAndLeavesOtherColumnsAlone) {
  const std::vector<float> w = {std::nanf(""), 1.0f, 0.5f, 7.0f};  // [2, 2], NaN in column 0
  const Outputs out = run(w, Case{2, 2, 2}, Device::Cpu);
  std::vector<int8_t> q(4);
  unpack_int4(out.packed, q);
  EXPECT_EQ(q[0], 0);
  EXPECT_EQ(out.scales[1], f32_to_f16(1.0f));  // column 1: amax 7
  EXPECT_EQ(q[1], 1);
  EXPECT_EQ(q[3], 7);
}

TEST(Int4Cpu, AllZeroBlockGetsScaleOneAndTinyBlockAPositiveScale) {
  const std::vector<float> w = {0.0f, 1.0e-9f, 0.0f, -1.0e-9f};  // column 0 zero, column 1 tiny
  const Case c{2, 2, 2};
  const Outputs out = run(w, c, Device::Cpu);
  EXPECT_EQ(out.scales[0], f32_to_f16(1.0f));
  EXPECT_EQ(out.scales[1], 0x0001);  // 1e-9 / 7 underflows fp16: smallest subnormal
  EXPECT_EQ(out.deq[0], 0.0f);
  EXPECT_EQ(out.deq[2], 0.0f);
}

TEST(Int4Cpu, PartialLastBlockHasItsOwnScale) {
  const Case c{40, 2, 32};  // blocks: rows 0..31 and 32..39
  std::vector<float> w(80, 0.7f);
  w[39 * 2 + 1] = 70.0f;  // only block 1 of column 1 sees it
  const Outputs out = run(w, c, Device::Cpu);
  ASSERT_EQ(out.scales.size(), 4u);
  EXPECT_EQ(out.scales[0], f32_to_f16(0.1f));
  EXPECT_EQ(out.scales[1], f32_to_f16(0.1f));
  EXPECT_EQ(out.scales[2], f32_to_f16(0.1f));
  EXPECT_EQ(out.scales[3], f32_to_f16(10.0f));
  EXPECT_EQ(out.deq[39 * 2 + 1], 70.0f);
  EXPECT_EQ(out.deq[38 * 2 + 1], 0.0f);  // 0.7 / 10 rounds to 0
}

TEST(Int4Cpu, PacksLowNibbleFirstInRowMajorOrder) {
  // [3, 1]: q = 1, -1, 7 -> bytes 0xF1 (low 1, high -1), 0x07 (high nibble of the tail zero).
  const std::vector<float> w = {1.0f, -1.0f, 7.0f};
  const Outputs out = run(w, Case{3, 1, 4}, Device::Cpu);
  EXPECT_EQ(out.packed, (std::vector<uint8_t>{0xF1, 0x07}));
  std::vector<uint8_t> packed(2);
  pack_int4(std::vector<int8_t>{1, -1, 7}, packed);
  EXPECT_EQ(packed, out.packed);
  std::vector<int8_t> q(3);
  unpack_int4(out.packed, q);
  EXPECT_EQ(q, (std::vector<int8_t>{1, -1, 7}));
}

TEST(Int4Cpu, ThreadCountDoesNotChangeResults) {
  for (const Case& c : kCases) {
    SCOPED_TRACE("case " + c.str());
    const auto w = random_weight(c, 7);
    Outputs one, two;
    {
      ThreadCount threads(1);
      one = run(w, c, Device::Cpu);
    }
    {
      ThreadCount threads(2);
      two = run(w, c, Device::Cpu);
    }
    EXPECT_TRUE(same_bytes(one.scales, two.scales));
    EXPECT_TRUE(same_bytes(one.packed, two.packed));
    EXPECT_TRUE(same_bytes(one.deq, two.deq));
  }
}

TEST(Int4Cpu, MismatchedSizesAndBadValuesAreInternalErrors) {
  std::vector<float> w(8, 1.0f);
  std::vector<uint16_t> scales(2);
  std::vector<uint8_t> packed(4);
  auto expect_internal = [](auto&& f) {
    try {
      f();
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.category(), ErrorCategory::Internal) << e.what();
    }
  };
  expect_internal(
      [&] { quantize_int4_blocked(w, 4, 2, 2, scales, packed, Device::Cpu); });  // 4 scales
  expect_internal([&] { quantize_int4_blocked(w, 4, 2, 0, scales, packed, Device::Cpu); });
  std::vector<uint8_t> short_packed(3);
  expect_internal([&] { quantize_int4_blocked(w, 8, 1, 4, scales, short_packed, Device::Cpu); });
  expect_internal([&] {
    pack_int4(std::vector<int8_t>{8, 0}, std::span<uint8_t>(packed).first(1));
  });
  expect_internal([] { (void)int4_symmetric_scale_f16(std::nanf("")); });
}

TEST(Int4Cuda, MatchesCpuTwinBitForBit) {
  QFORGE_NEEDS_CUDA_DEVICE("CUDA twin of int4 kernels not run");
  std::vector<Case> cases(std::begin(kCases), std::end(kCases));
  // More than 2^21 elements and 2^20 packed bytes: the pack and dequantize kernels' grid-stride
  // loops (a grid covers 2^20 threads) take more than one pass.
  cases.push_back({4096, 600, 128});
  cases.push_back({2049, 1031, 32});
  for (const Case& c : cases) {
    SCOPED_TRACE("case " + c.str());
    auto w = random_weight(c, 99);
    w[0] = 1.0e6f;  // overflowing scale and clamping
    const Outputs cpu = run(w, c, Device::Cpu);
    const Outputs gpu = run(w, c, Device::Cuda);
    EXPECT_TRUE(same_bytes(cpu.scales, gpu.scales));
    EXPECT_TRUE(same_bytes(cpu.packed, gpu.packed));
    EXPECT_TRUE(same_bytes(cpu.deq, gpu.deq));
  }
  const std::vector<float> ties = {7.0f, 0.5f, 1.5f, 2.5f, -0.5f, -1.5f, -2.5f, 6.5f};
  EXPECT_TRUE(same_bytes(run(ties, Case{8, 1, 8}, Device::Cpu).packed,
                         run(ties, Case{8, 1, 8}, Device::Cuda).packed));
}
