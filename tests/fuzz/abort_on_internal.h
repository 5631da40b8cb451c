#pragma once
// Shared by the fuzz targets: an input refused with a qforge::Error is the expected outcome,
// unless the category is Internal. That one means a bug in qforge (a broken invariant, a size
// check that should have caught the input earlier), so the target aborts and libFuzzer reports
// the input instead of counting it as a clean rejection.
#include <cstdio>
#include <cstdlib>

#include "ir/error.h"

namespace qforge::fuzz {

// Call first thing in every `catch (const qforge::Error& e)` of a fuzz target.
inline void abort_on_internal(const Error& e) {
  if (e.category() != ErrorCategory::Internal) return;
  std::fprintf(stderr, "qforge::Error(Internal), a bug: %s\n", e.what());
  std::abort();
}

}  // namespace qforge::fuzz
