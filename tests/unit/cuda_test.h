#pragma once
// Skip-or-fail for the tests of CUDA code, one rule for all of them. Where the CUDA path cannot
// run (no device answers, the build lacks CUDA or cuBLAS, the driver does not match the
// toolkit) such a test has nothing to compare: it skips, saying why. With QFORGE_REQUIRE_CUDA=1
// in the environment (scripts/test.sh sets it when nvidia-smi lists a GPU) it fails instead, so
// a GPU machine cannot pass these tests by running everything on the CPU.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <string_view>

#include "ir/error.h"
#include "kernels/device.h"
#include "qforge/cublas_config.h"

namespace qforge::test {

// QFORGE_REQUIRE_CUDA is set to 1.
inline bool cuda_required() {
  const char* value = std::getenv("QFORGE_REQUIRE_CUDA");
  return value != nullptr && std::string_view(value) == "1";
}

// Why Device::Cuda cannot run here (resolve_device's message), or "" when it can.
inline std::string cuda_missing_reason() {
  if (cuda_available()) return "";
  try {
    resolve_device(Device::Cuda);
  } catch (const Error& e) {
    return e.what();
  }
  return "resolve_device(Cuda) accepted a device that cuda_available() denies";
}

// Why the cuBLAS products cannot run in this build, or "" when they can (the library itself is
// loaded at first use; a failure to load it is an error there).
inline std::string cublas_missing_reason() {
  return QFORGE_HAVE_CUBLAS ? "" : "built without cuBLAS headers (QFORGE_CUBLAS_ROOT)";
}

}  // namespace qforge::test

// In a TEST body: when `missing_reason` (a std::string) is not empty, ends the test, skipped,
// or failed under QFORGE_REQUIRE_CUDA=1; `what` says what was not run.
#define QFORGE_CUDA_TEST_SKIP_IF(missing_reason, what)                                     \
  do {                                                                                     \
    const std::string qforge_cuda_missing = (missing_reason);                              \
    if (!qforge_cuda_missing.empty()) {                                                    \
      if (::qforge::test::cuda_required()) {                                               \
        GTEST_FAIL() << "QFORGE_REQUIRE_CUDA=1 but " << qforge_cuda_missing << ": " << (what); \
      }                                                                                    \
      GTEST_SKIP() << qforge_cuda_missing << ": " << (what);                               \
    }                                                                                      \
  } while (false)

// In a TEST body: the test needs a CUDA device, or cuBLAS in the build; see above.
#define QFORGE_NEEDS_CUDA_DEVICE(what) \
  QFORGE_CUDA_TEST_SKIP_IF(::qforge::test::cuda_missing_reason(), what)
#define QFORGE_NEEDS_CUBLAS(what) \
  QFORGE_CUDA_TEST_SKIP_IF(::qforge::test::cublas_missing_reason(), what)
