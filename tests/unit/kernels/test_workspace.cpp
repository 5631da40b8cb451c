// KernelWorkspace (kernels/workspace.h): device buffers a pass keeps across kernel calls, and
// int4_round_trip (kernels/int4.h), the quantize-then-dequantize call that searches repeat.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ir/error.h"
#include "kernels/calib.h"
#include "kernels/device.h"
#include "kernels/int4.h"
#include "kernels/quantize.h"
#include "kernels/workspace.h"
#include "tests/unit/cuda_test.h"

using namespace qforge;

namespace {

std::vector<float> random_weight(int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 0.3f);
  std::vector<float> w(static_cast<size_t>(rows * cols));
  for (float& v : w) v = dist(rng);
  return w;
}

struct RoundTrip {
  std::vector<uint16_t> scales;
  std::vector<uint8_t> packed;
  std::vector<float> out;
};

RoundTrip round_trip(const std::vector<float>& w, int64_t rows, int64_t cols, int64_t block,
                     Device device, Int4Scale scale, KernelWorkspace* workspace) {
  RoundTrip r;
  r.scales.resize(static_cast<size_t>(int4_block_count(rows, block) * cols));
  r.packed.resize(static_cast<size_t>(int4_packed_bytes(rows * cols)));
  r.out.resize(w.size());
  int4_round_trip(w, rows, cols, block, r.scales, r.packed, r.out, device, scale, workspace);
  return r;
}

// The two calls int4_round_trip stands for.
RoundTrip two_calls(const std::vector<float>& w, int64_t rows, int64_t cols, int64_t block,
                    Device device, Int4Scale scale) {
  RoundTrip r;
  r.scales.resize(static_cast<size_t>(int4_block_count(rows, block) * cols));
  r.packed.resize(static_cast<size_t>(int4_packed_bytes(rows * cols)));
  r.out.resize(w.size());
  quantize_int4_blocked(w, rows, cols, block, r.scales, r.packed, device, scale);
  dequantize_int4_blocked(r.packed, r.scales, rows, cols, block, r.out, device);
  return r;
}

void expect_same(const RoundTrip& a, const RoundTrip& b) {
  EXPECT_EQ(a.scales, b.scales);
  EXPECT_EQ(a.packed, b.packed);
  ASSERT_EQ(a.out.size(), b.out.size());
  EXPECT_EQ(std::memcmp(a.out.data(), b.out.data(), a.out.size() * sizeof(float)), 0);
}

ErrorCategory category_of(auto&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.category();
  }
  ADD_FAILURE() << "no qforge::Error thrown";
  return ErrorCategory::Usage;
}

}  // namespace

TEST(Int4RoundTrip, EqualsQuantizeThenDequantizeOnCpu) {
  for (const Int4Scale scale : {Int4Scale::Amax, Int4Scale::Mse}) {
    const std::vector<float> w = random_weight(130, 17, 5);  // a partial last block
    expect_same(round_trip(w, 130, 17, 32, Device::Cpu, scale, nullptr),
                two_calls(w, 130, 17, 32, Device::Cpu, scale));
  }
}

TEST(Int4RoundTrip, MismatchedSizesAreInternalErrors) {
  const std::vector<float> w(64, 1.0f);
  std::vector<uint16_t> scales(2);
  std::vector<uint8_t> packed(32);
  std::vector<float> out(63);
  EXPECT_EQ(category_of([&] {
              int4_round_trip(w, 64, 1, 32, scales, packed, out, Device::Cpu);
            }),
            ErrorCategory::Internal);
}

TEST(KernelWorkspace, CpuKernelsNeverAllocateDeviceMemory) {
  KernelWorkspace workspace;
  const std::vector<float> w = random_weight(64, 48, 3);
  expect_same(round_trip(w, 64, 48, 32, Device::Cpu, Int4Scale::Amax, &workspace),
              round_trip(w, 64, 48, 32, Device::Cpu, Int4Scale::Amax, nullptr));
  std::vector<float> amaxes(48);
  amax_per_channel(w, 64, 48, 1, amaxes, Device::Cpu, &workspace);
  std::vector<uint64_t> bins(16);
  histogram_abs(w, 1.0f, bins, Device::Cpu, &workspace);
  EXPECT_EQ(minmax(w, Device::Cpu, &workspace).count, w.size());
  EXPECT_EQ(workspace.device_allocations(), 0);
}

TEST(KernelWorkspace, BadSlotsAndMissingCudaAreInternalErrors) {
  KernelWorkspace workspace;
  EXPECT_EQ(category_of([&] { workspace.device_buffer(-1, 16); }), ErrorCategory::Internal);
  EXPECT_EQ(category_of([&] { workspace.device_buffer(KernelWorkspace::kSlots, 16); }),
            ErrorCategory::Internal);
  if (!cuda_built()) {
    EXPECT_EQ(category_of([&] { workspace.device_buffer(0, 16); }), ErrorCategory::Internal);
  }
  EXPECT_EQ(workspace.device_allocations(), 0);
}

TEST(KernelWorkspaceCuda, PassSizedBuffersAreAllocatedOnceAndGiveTheCpuBytes) {
  QFORGE_NEEDS_CUDA_DEVICE("device buffer reuse not checked");
  KernelWorkspace workspace;
  const std::vector<float> w = random_weight(512, 96, 7);
  const RoundTrip cpu = round_trip(w, 512, 96, 128, Device::Cpu, Int4Scale::Mse, nullptr);
  // An AWQ grid: twenty round trips of one shape.
  for (int point = 0; point < 20; ++point) {
    SCOPED_TRACE("point " + std::to_string(point));
    expect_same(round_trip(w, 512, 96, 128, Device::Cuda, Int4Scale::Mse, &workspace), cpu);
  }
  EXPECT_EQ(workspace.device_allocations(), KernelWorkspace::kSlots)
      << "weight, scales, packed and output, each allocated once";
  // Smaller calls of other kernels fit the buffers already there.
  std::vector<float> amaxes(96), cpu_amaxes(96);
  amax_per_channel(w, 512, 96, 1, amaxes, Device::Cuda, &workspace);
  amax_per_channel(w, 512, 96, 1, cpu_amaxes, Device::Cpu);
  EXPECT_EQ(amaxes, cpu_amaxes);
  std::vector<uint64_t> bins(64), cpu_bins(64);  // 512 bytes: within the scales buffer
  histogram_abs(w, 1.0f, bins, Device::Cuda, &workspace);
  histogram_abs(w, 1.0f, cpu_bins, Device::Cpu);
  EXPECT_EQ(bins, cpu_bins);
  EXPECT_EQ(workspace.device_allocations(), KernelWorkspace::kSlots);
  // A larger weight grows the buffers it needs.
  const std::vector<float> big = random_weight(1024, 96, 8);
  expect_same(round_trip(big, 1024, 96, 128, Device::Cuda, Int4Scale::Amax, &workspace),
              round_trip(big, 1024, 96, 128, Device::Cpu, Int4Scale::Amax, nullptr));
  EXPECT_GT(workspace.device_allocations(), KernelWorkspace::kSlots);
}
