#pragma once
// Packing of a block-quantized int4 weight into ONNX Runtime's com.microsoft MatMulNBits layout
// (bits = 4): B is uint8 [N, n_blocks, block_size / 2], column n's block b holding
// K rows b * block_size .. as unsigned nibbles q + 8, low nibble first, padded with 8 (zero) past
// K; scales are [N * n_blocks] in column-major block order; no zero_points input, so ORT uses its
// default 8 (2^(bits - 1)).
#include <cstdint>
#include <span>
#include <vector>

namespace qforge {

struct MatMulNBitsWeight {
  std::vector<uint8_t> b;     // [n, n_blocks, block_size / 2]
  std::vector<float> scales;  // [n * n_blocks], as floats (the caller picks the dtype)
};

// q: int4 values of B[K, N] row-major (unpacked, in [-8, 7]); scales: [n_blocks, N] as floats.
MatMulNBitsWeight pack_matmulnbits(std::span<const int8_t> q, std::span<const float> scales,
                                   int64_t k, int64_t n, int64_t block_size);

}  // namespace qforge
