#pragma once
// Sets the CPU kernels' thread count for a scope (a pass run with --threads N) and restores the
// previous one on exit; 0 leaves it as it is.
#include "kernels/device.h"

namespace qforge {

class CpuThreadsScope {
 public:
  explicit CpuThreadsScope(int threads) : saved_(threads > 0 ? cpu_threads() : 0) {
    if (threads > 0) set_cpu_threads(threads);
  }
  ~CpuThreadsScope() {
    if (saved_ > 0) set_cpu_threads(saved_);
  }
  CpuThreadsScope(const CpuThreadsScope&) = delete;
  CpuThreadsScope& operator=(const CpuThreadsScope&) = delete;

 private:
  int saved_;
};

}  // namespace qforge
