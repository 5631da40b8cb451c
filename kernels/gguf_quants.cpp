#include "kernels/gguf_quants.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "ir/error.h"
#include "ir/half.h"
#include "kernels/cpu/task_pool.h"
#include "kernels/device.h"

namespace qforge {

namespace {

constexpr size_t kBlock = 32;

void put_u16(std::byte* p, uint16_t v) { std::memcpy(p, &v, 2); }
uint16_t get_u16(const std::byte* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// std::round for |v| < 2^23 (here |v| <= 127), without a library call or a float compare (GCC
// keeps those as branches), so that a block's loop vectorizes: the truncation t and the
// fraction v - t are exact, and a fraction of at least one half (compared on its magnitude's
// bits) moves t one step away from zero, in the fraction's sign.
inline int round_half_away(float v) {
  const int t = static_cast<int>(v);
  const auto frac = std::bit_cast<int32_t>(v - static_cast<float>(t));
  return t + ((frac & 0x7fffffff) >= 0x3f000000 ? (1 | (frac >> 31)) : 0);
}

// |x| as its bits, which order as the magnitudes do, so that a block's max is an integer one
// that vectorizes; a NaN counts as 0, so it never wins a max (as in ggml's float compares).
inline int32_t magnitude_bits(float x) {
  constexpr int32_t kInfBits = 0x7f800000;
  const int32_t m = std::bit_cast<int32_t>(x) & 0x7fffffff;
  return m > kInfBits ? 0 : m;
}

// Q8_0: d = amax / 127, q = round-half-away(x / d) (ggml's roundf, gguf-py's np_roundf).
void q8_0_block(const float* x, std::byte* out) {
  int32_t top = 0;
  for (size_t j = 0; j < kBlock; ++j) top = std::max(top, magnitude_bits(x[j]));
  const float amax = std::bit_cast<float>(top);
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  put_u16(out, f32_to_f16(d));
  int8_t q[kBlock];
  for (size_t j = 0; j < kBlock; ++j) q[j] = static_cast<int8_t>(round_half_away(x[j] * id));
  std::memcpy(out + 2, q, kBlock);
}

// Q4_0: the largest-magnitude element keeps its sign, d = max / -8 so that it maps exactly to
// level 0; q = min(15, trunc(x / d + 8.5)); byte j holds element j (low) and j + 16 (high).
// The largest magnitude first (magnitude_bits), then the first element that has it: ggml's
// running "if (amax < |x|)" picks the same one. All zero (or NaN): max stays +0, as there.
void q4_0_block(const float* x, std::byte* out) {
  int32_t mag[kBlock];
  for (size_t j = 0; j < kBlock; ++j) mag[j] = magnitude_bits(x[j]);
  int32_t top = 0;
  for (size_t j = 0; j < kBlock; ++j) top = std::max(top, mag[j]);
  float max = 0.0f;
  if (top > 0) {
    size_t first = 0;
    while (mag[first] != top) ++first;
    max = x[first];
  }
  const float d = max / -8.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  put_u16(out, f32_to_f16(d));
  uint8_t q[kBlock];
  for (size_t j = 0; j < kBlock; ++j) {
    // The conversion to int truncates toward zero, as ggml's (int8_t)(x * id + 8.5f).
    const float v = x[j] * id + 8.5f;
    q[j] = static_cast<uint8_t>(std::clamp(static_cast<int>(v), 0, 15));
  }
  for (size_t j = 0; j < kBlock / 2; ++j) {
    out[2 + j] = static_cast<std::byte>(q[j] | (q[j + kBlock / 2] << 4));
  }
}

// Q4_1: d = (max - min) / 15, m = min; q = min(15, trunc((x - min) / d + 0.5)).
void q4_1_block(const float* x, std::byte* out) {
  float min = x[0];
  float max = x[0];
  for (size_t j = 1; j < kBlock; ++j) {
    min = std::min(min, x[j]);
    max = std::max(max, x[j]);
  }
  const float d = (max - min) / 15.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  put_u16(out, f32_to_f16(d));
  put_u16(out + 2, f32_to_f16(min));
  uint8_t q[kBlock];
  for (size_t j = 0; j < kBlock; ++j) {
    const float v = (x[j] - min) * id + 0.5f;
    q[j] = static_cast<uint8_t>(std::clamp(static_cast<int>(v), 0, 15));
  }
  for (size_t j = 0; j < kBlock / 2; ++j) {
    out[4 + j] = static_cast<std::byte>(q[j] | (q[j + kBlock / 2] << 4));
  }
}

void check_sizes(gguf::TensorType type, size_t n, size_t bytes, const char* what) {
  if (gguf_row_bytes(type, n) != bytes) {
    fail_internal(std::string(what) + ": " + std::to_string(n) + " elements of " +
                  std::string(gguf::tensor_type_info(type).name) + " do not take " +
                  std::to_string(bytes) + " bytes");
  }
}

}  // namespace

uint64_t gguf_row_bytes(gguf::TensorType type, uint64_t n) {
  const auto& info = gguf::tensor_type_info(type);
  if (n % info.block_size != 0) {
    fail_invalid("a row of " + std::to_string(n) + " elements is not a whole number of " +
                 std::string(info.name) + " blocks of " + std::to_string(info.block_size));
  }
  return n / info.block_size * info.type_size;
}

void gguf_quantize_row(gguf::TensorType type, std::span<const float> row,
                       std::span<std::byte> out) {
  check_sizes(type, row.size(), out.size(), "gguf_quantize_row");
  std::byte* o = out.data();
  switch (type) {
    case gguf::TensorType::F32:
      std::memcpy(o, row.data(), row.size_bytes());
      return;
    case gguf::TensorType::F16:
      for (size_t i = 0; i < row.size(); ++i) put_u16(o + 2 * i, f32_to_f16(row[i]));
      return;
    case gguf::TensorType::BF16:
      for (size_t i = 0; i < row.size(); ++i) put_u16(o + 2 * i, f32_to_bf16(row[i]));
      return;
    case gguf::TensorType::Q8_0:
      for (size_t b = 0; b < row.size() / kBlock; ++b) q8_0_block(&row[b * kBlock], o + b * 34);
      return;
    case gguf::TensorType::Q4_0:
      for (size_t b = 0; b < row.size() / kBlock; ++b) q4_0_block(&row[b * kBlock], o + b * 18);
      return;
    case gguf::TensorType::Q4_1:
      for (size_t b = 0; b < row.size() / kBlock; ++b) q4_1_block(&row[b * kBlock], o + b * 20);
      return;
  }
  fail_internal("gguf_quantize_row: unknown type");
}

void gguf_quantize_rows(gguf::TensorType type, int64_t rows, int64_t cols,
                        const GgufRowSource& source, std::span<std::byte> out) {
  const uint64_t row_bytes = gguf_row_bytes(type, static_cast<uint64_t>(cols));
  if (out.size() != static_cast<uint64_t>(rows) * row_bytes) {
    fail_internal("gguf_quantize_rows: " + std::to_string(rows) + " x " + std::to_string(cols) +
                  " does not match " + std::to_string(out.size()) + " bytes");
  }
  const auto n = static_cast<size_t>(cols);
  // A row a task on the task pool (kernels/cpu/task_pool.h), each thread its own row buffer;
  // small tensors (norms) stay on one thread.
  const int threads = rows * cols >= (1 << 16) ? cpu_threads() : 1;
  std::vector<std::vector<float>> buffers(static_cast<size_t>(threads));
  run_tasks(threads, rows, [&](int64_t r, int slot) {
    std::vector<float>& row = buffers[static_cast<size_t>(slot)];
    row.resize(n);
    source(r, row);
    gguf_quantize_row(type, row, out.subspan(static_cast<size_t>(r) * row_bytes, row_bytes));
  });
}

void gguf_encode_levels_row(gguf::TensorType type, std::span<const int8_t> q,
                            std::span<const uint16_t> d, std::span<std::byte> out) {
  check_sizes(type, q.size(), out.size(), "gguf_encode_levels_row");
  const size_t nb = q.size() / kBlock;
  if (d.size() != nb) fail_internal("gguf_encode_levels_row: one scale per block of 32 expected");
  const int8_t lo = type == gguf::TensorType::Q8_0 ? -127 : -8;
  const int8_t hi = type == gguf::TensorType::Q8_0 ? 127 : 7;
  for (const int8_t v : q) {
    if (v < lo || v > hi) {
      fail_internal("gguf_encode_levels_row: level " + std::to_string(v) + " does not fit " +
                    std::string(gguf::tensor_type_info(type).name));
    }
  }
  std::byte* o = out.data();
  for (size_t b = 0; b < nb; ++b) {
    const int8_t* x = q.data() + b * kBlock;
    switch (type) {
      case gguf::TensorType::Q8_0:
        put_u16(o, d[b]);
        std::memcpy(o + 2, x, kBlock);
        o += 34;
        break;
      case gguf::TensorType::Q4_0:
      case gguf::TensorType::Q4_1: {
        const bool q41 = type == gguf::TensorType::Q4_1;
        put_u16(o, d[b]);
        if (q41) put_u16(o + 2, f32_to_f16(-8.0f * f16_to_f32(d[b])));
        std::byte* qs = o + (q41 ? 4 : 2);
        for (size_t j = 0; j < kBlock / 2; ++j) {
          const auto l = static_cast<uint8_t>(x[j] + 8);
          const auto h = static_cast<uint8_t>(x[j + kBlock / 2] + 8);
          qs[j] = static_cast<std::byte>(l | (h << 4));
        }
        o += q41 ? 20 : 18;
        break;
      }
      default:
        fail_internal("gguf_encode_levels_row: " +
                      std::string(gguf::tensor_type_info(type).name) + " is not a block type");
    }
  }
}

void gguf_dequantize_row(gguf::TensorType type, std::span<const std::byte> in,
                         std::span<float> out) {
  check_sizes(type, out.size(), in.size(), "gguf_dequantize_row");
  const std::byte* p = in.data();
  const size_t nb = out.size() / kBlock;
  switch (type) {
    case gguf::TensorType::F32:
      std::memcpy(out.data(), p, in.size());
      return;
    case gguf::TensorType::F16:
      for (size_t i = 0; i < out.size(); ++i) out[i] = f16_to_f32(get_u16(p + 2 * i));
      return;
    case gguf::TensorType::BF16:
      for (size_t i = 0; i < out.size(); ++i) out[i] = bf16_to_f32(get_u16(p + 2 * i));
      return;
    case gguf::TensorType::Q8_0:
      for (size_t b = 0; b < nb; ++b) {
        const std::byte* blk = p + b * 34;
        const float d = f16_to_f32(get_u16(blk));
        for (size_t j = 0; j < kBlock; ++j) {
          out[b * kBlock + j] = static_cast<float>(static_cast<int8_t>(blk[2 + j])) * d;
        }
      }
      return;
    case gguf::TensorType::Q4_0:
    case gguf::TensorType::Q4_1: {
      const bool q41 = type == gguf::TensorType::Q4_1;
      const size_t size = q41 ? 20 : 18;
      const size_t qs = q41 ? 4 : 2;
      for (size_t b = 0; b < nb; ++b) {
        const std::byte* blk = p + b * size;
        const float d = f16_to_f32(get_u16(blk));
        const float m = q41 ? f16_to_f32(get_u16(blk + 2)) : 0.0f;
        for (size_t j = 0; j < kBlock / 2; ++j) {
          const auto byte = static_cast<uint8_t>(blk[qs + j]);
          const int lo = byte & 0x0f;
          const int hi = byte >> 4;
          if (q41) {
            out[b * kBlock + j] = d * static_cast<float>(lo) + m;
            out[b * kBlock + j + 16] = d * static_cast<float>(hi) + m;
          } else {
            out[b * kBlock + j] = static_cast<float>(lo - 8) * d;
            out[b * kBlock + j + 16] = static_cast<float>(hi - 8) * d;
          }
        }
      }
      return;
    }
  }
  fail_internal("gguf_dequantize_row: unknown type");
}

}  // namespace qforge
