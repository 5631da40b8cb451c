#pragma once
// A weight's values as f32 for the quantizers: an f32 tensor is read in place, anything else
// (f16, bf16, or an f32 window of a memory-mapped file left misaligned for float loads) is
// widened into a buffer this object owns.
#include <cstdint>
#include <span>
#include <vector>

#include "ir/tensor.h"

namespace qforge {

class F32Values {
 public:
  explicit F32Values(const Tensor& tensor) {
    const bool aligned =
        reinterpret_cast<uintptr_t>(tensor.bytes().data()) % alignof(float) == 0;
    if (tensor.dtype() == DType::F32 && aligned) {
      values_ = tensor.data<float>();
    } else {
      widened_ = tensor.to_f32();
      values_ = widened_;
    }
  }
  // The span may point into this object: neither copied nor moved.
  F32Values(const F32Values&) = delete;
  F32Values& operator=(const F32Values&) = delete;

  std::span<const float> span() const { return values_; }

 private:
  std::vector<float> widened_;
  std::span<const float> values_;
};

}  // namespace qforge
