// The rule every CUDA test follows (tests/unit/cuda_test.h): skip, saying why, where the CUDA
// path cannot run; fail instead under QFORGE_REQUIRE_CUDA=1.
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <optional>
#include <string>

#include "kernels/device.h"
#include "tests/unit/cuda_test.h"

using namespace qforge;

namespace {

// Sets (or unsets, with nullopt) an environment variable for the life of the object.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, std::optional<std::string> value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) {
      setenv(name, value->c_str(), 1);
    } else {
      unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      setenv(name_, old_->c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

void test_body_without_cuda() {
  QFORGE_CUDA_TEST_SKIP_IF(std::string("no CUDA device: probe said so"), "the twin not compared");
}

}  // namespace

TEST(CudaTestRule, OnlyTheValueOneRequiresCuda) {
  {
    ScopedEnv env("QFORGE_REQUIRE_CUDA", std::nullopt);
    EXPECT_FALSE(test::cuda_required());
  }
  {
    ScopedEnv env("QFORGE_REQUIRE_CUDA", "0");
    EXPECT_FALSE(test::cuda_required());
  }
  ScopedEnv env("QFORGE_REQUIRE_CUDA", "1");
  EXPECT_TRUE(test::cuda_required());
}

TEST(CudaTestRule, FailsInsteadOfSkippingWhenCudaIsRequired) {
  ScopedEnv env("QFORGE_REQUIRE_CUDA", "1");
  EXPECT_FATAL_FAILURE(test_body_without_cuda(),
                       "QFORGE_REQUIRE_CUDA=1 but no CUDA device: probe said so: the twin not "
                       "compared");
}

TEST(CudaTestRule, MissingReasonIsEmptyExactlyWhenADeviceAnswers) {
  const std::string reason = test::cuda_missing_reason();
  EXPECT_EQ(reason.empty(), cuda_available()) << reason;
  if (!cuda_available()) {
    EXPECT_EQ(reason.rfind("--device cuda: ", 0), 0u) << reason;
    EXPECT_NE(reason.find(cuda_built() ? "no CUDA device: " : "CUDA not built in"),
              std::string::npos)
        << reason;
  }
}
