#include "quant/w4a16/w4a16_matmulnbits.h"

#include <string>

#include "ir/error.h"

namespace qforge {

MatMulNBitsWeight pack_matmulnbits(std::span<const int8_t> q, std::span<const float> scales,
                                   int64_t k, int64_t n, int64_t block_size) {
  const int64_t blocks = (k + block_size - 1) / block_size;
  const int64_t blob = block_size / 2;
  if (block_size < 2 || block_size % 2 != 0 || static_cast<int64_t>(q.size()) != k * n ||
      static_cast<int64_t>(scales.size()) != blocks * n) {
    fail_internal("pack_matmulnbits: sizes q " + std::to_string(q.size()) + ", scales " +
                  std::to_string(scales.size()) + " do not fit K " + std::to_string(k) + ", N " +
                  std::to_string(n) + ", block_size " + std::to_string(block_size));
  }
  MatMulNBitsWeight w;
  w.b.assign(static_cast<size_t>(n * blocks * blob), 0x88);  // zero point 8 in both nibbles
  w.scales.resize(static_cast<size_t>(n * blocks));
  for (int64_t col = 0; col < n; ++col) {
    for (int64_t b = 0; b < blocks; ++b) {
      w.scales[static_cast<size_t>(col * blocks + b)] = scales[static_cast<size_t>(b * n + col)];
      uint8_t* blob_bytes = w.b.data() + (col * blocks + b) * blob;
      for (int64_t j = 0; j < block_size && b * block_size + j < k; ++j) {
        const int8_t v = q[static_cast<size_t>((b * block_size + j) * n + col)];
        const auto u = static_cast<uint8_t>(v + 8);
        uint8_t& byte = blob_bytes[j / 2];
        byte = j % 2 == 0 ? static_cast<uint8_t>((byte & 0xf0) | u)
                          : static_cast<uint8_t>((byte & 0x0f) | (u << 4));
      }
    }
  }
  return w;
}

}  // namespace qforge
