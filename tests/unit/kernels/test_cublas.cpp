// cuBLAS loaded at first use (kernels/cuda/cublas_loader.h) and the products that use it: the
// LoRA delta on Device::Cuda against the CPU path.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "ir/error.h"
#include "kernels/device.h"
#include "qforge/cublas_config.h"
#include "quant/lora/lora_math.h"
#include "tests/unit/cuda_test.h"
#if QFORGE_HAVE_CUBLAS
#include "kernels/cuda/cublas_loader.h"
#endif

using namespace qforge;

#if QFORGE_HAVE_CUBLAS
TEST(CublasLoader, LoadsTheLibraryOrSaysHowToInstallIt) {
  try {
    // Loading resolves every entry point qforge uses, or throws; it needs no device.
    const cuda::CublasLibrary& lib = cuda::load_cublas();
    EXPECT_NE(lib.path.find("libcublas.so.13"), std::string::npos) << lib.path;
    EXPECT_EQ(&lib, &cuda::load_cublas()) << "loaded once";
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), ErrorCategory::Unsupported);
    EXPECT_NE(std::string(e.what()).find("pip install nvidia-cublas"), std::string::npos)
        << e.what();
    // Where the GPU run is required, a library that does not load is a failure, not a message.
    EXPECT_FALSE(test::cuda_required()) << "QFORGE_REQUIRE_CUDA=1 but " << e.what();
  }
}

TEST(CublasLoader, AMissingLibraryNamesItAndHowToInstall) {
  try {
    cuda::load_cublas_from("/nonexistent/libcublas.so.13");
    FAIL() << "loaded a library that does not exist";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(e.category(), ErrorCategory::Unsupported);
    EXPECT_NE(msg.find("cannot load the cuBLAS library /nonexistent/libcublas.so.13"),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find("pip install nvidia-cublas==13.10.0.20"), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "one line";
  }
}
#else
TEST(CublasLoader, LoadsTheLibraryOrSaysHowToInstallIt) {
  QFORGE_NEEDS_CUBLAS("no loader to test");
}
#endif

namespace {

std::vector<float> random(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

}  // namespace

TEST(LoraDeltaCuda, WithoutADeviceSaysSo) {
  if (cuda_available()) GTEST_SKIP() << "a CUDA device is present: the no-device path is not run";
  const std::vector<float> a = random(4 * 6, 1), b = random(5 * 4, 2);
  std::vector<float> d(5 * 6);
  try {
    lora_delta(a, b, 5, 6, 4, 0.5f, false, d, Device::Cuda);
    FAIL() << "ran on CUDA without a device";
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), ErrorCategory::Unsupported);
    EXPECT_NE(std::string(e.what()).find(cuda_built() ? "no CUDA device: " : "CUDA not built in"),
              std::string::npos)
        << e.what();
  }
}

TEST(LoraDeltaCuda, MatchesCpu) {
  QFORGE_NEEDS_CUDA_DEVICE("cuBLAS LoRA product not compared");
  QFORGE_NEEDS_CUBLAS("the LoRA product runs on CPU");
  const int64_t out = 300, in = 257, r = 16;
  const std::vector<float> a = random(static_cast<size_t>(r * in), 3);
  const std::vector<float> b = random(static_cast<size_t>(out * r), 4);
  for (const bool transposed : {false, true}) {
    std::vector<float> cpu(static_cast<size_t>(out * in)), gpu(cpu.size());
    lora_delta(a, b, out, in, r, 0.25f, transposed, cpu, Device::Cpu);
    lora_delta(a, b, out, in, r, 0.25f, transposed, gpu, Device::Cuda);
    for (size_t i = 0; i < cpu.size(); ++i) {
      // r = 16 products of N(0, 1) values: a few f32 roundings of a sum of magnitude ~16.
      ASSERT_NEAR(gpu[i], cpu[i], 1e-5f * 16.0f) << (transposed ? "transposed " : "") << i;
    }
  }
}
