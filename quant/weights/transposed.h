#pragma once
// A row-major [rows, cols] matrix as [cols, rows]: the int4 kernels block along rows, so a
// weight reduced along its columns is quantized transposed (W4A16, GPTQ) and its values and
// scales transposed back.
#include <cstdint>
#include <span>
#include <vector>

namespace qforge {

template <typename T>
std::vector<T> transposed(std::span<const T> x, int64_t rows, int64_t cols) {
  std::vector<T> t(x.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      t[static_cast<size_t>(c * rows + r)] = x[static_cast<size_t>(r * cols + c)];
  return t;
}

}  // namespace qforge
