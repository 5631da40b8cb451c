#include "exporters/awq/awq_writer.h"

#include <algorithm>
#include <array>

#include "exporters/quant_checkpoint/linear_values.h"
#include "ir/error.h"

namespace qforge {

namespace {

// Field i of a word holds output column 8c + kOrder[i] (AutoAWQ's order_map).
constexpr std::array<int, 8> kOrder = {0, 2, 4, 6, 1, 3, 5, 7};

}  // namespace

Tensor pack_awq_qweight(const Tensor& values) {
  if (values.dtype() != DType::I4 || values.rank() != 2 || values.shape()[0] % 8 != 0) {
    fail_internal("pack_awq_qweight: " + std::string(dtype_name(values.dtype())) + " " +
                  shape_to_string(values.shape()) + " is not i4 [8m, K]");
  }
  const int64_t n = values.shape()[0], k = values.shape()[1];
  const int64_t words = n / 8;
  const uint8_t* in = values.data<uint8_t>().data();
  Tensor packed(DType::I32, {k, words});
  uint32_t* out = packed.mutable_data<uint32_t>().data();
  // Input columns in blocks, so that the 8 * words rows' bytes of a block stay in cache while
  // each output row (one input column) is written in order. Field i of a word is the nibble of
  // row 8c + kOrder[i] with its top bit flipped (q + 8).
  constexpr int64_t kBlock = 128;
  for (int64_t c0 = 0; c0 < k; c0 += kBlock) {
    const int64_t c1 = std::min(k, c0 + kBlock);
    for (int64_t c = 0; c < words; ++c) {
      int64_t row_start[8];
      for (int i = 0; i < 8; ++i) row_start[i] = (8 * c + kOrder[static_cast<size_t>(i)]) * k;
      int64_t col = c0;
      if (k % 2 == 0) {  // rows start on whole bytes: byte col / 2 holds columns col, col + 1
        for (; col + 1 < c1; col += 2) {
          uint32_t low = 0, high = 0;
          for (int i = 0; i < 8; ++i) {
            const uint32_t byte = in[(row_start[i] + col) / 2];
            low |= (byte & 0x0fu) << (4 * i);
            high |= (byte >> 4) << (4 * i);
          }
          out[col * words + c] = low ^ 0x88888888u;
          out[(col + 1) * words + c] = high ^ 0x88888888u;
        }
      }
      for (; col < c1; ++col) {
        uint32_t word = 0;
        for (int i = 0; i < 8; ++i) word |= int4_nibble(in, row_start[i] + col) << (4 * i);
        out[col * words + c] = word ^ 0x88888888u;
      }
    }
  }
  return packed;
}

Tensor pack_awq_qzeros(int64_t groups, int64_t n, uint32_t zero) {
  const int64_t words = n / 8;
  Tensor packed(DType::I32, {groups, words});
  uint32_t word = 0;
  for (int i = 0; i < 8; ++i) word |= (zero & 0xfu) << (4 * i);
  for (uint32_t& w : packed.mutable_data<uint32_t>()) w = word;
  return packed;
}

namespace {

class AwqLayout : public HfQuantLayout {
 public:
  std::string_view name() const override { return "awq"; }

  void write_linear(const QuantizedLinearView& q, TensorSink& out) const override {
    const int64_t n = q.values.shape()[0], k = q.values.shape()[1];
    if (q.bits != 4) {
      fail_unsupported("awq (AutoAWQ GEMM) holds 4-bit weights only; '" + q.module + "' is " +
                       std::to_string(q.bits) + "-bit: write --format gptq or "
                       "compressed-tensors for --quant int8-weights");
    }
    if (q.block_size <= 0 || k % q.block_size != 0) {
      fail_unsupported("awq needs groups that divide the input features: '" + q.module +
                       "' has " + std::to_string(k) + " and group " +
                       std::to_string(q.block_size));
    }
    if (n % 8 != 0) {
      fail_unsupported("awq packs eight output features per int32: '" + q.module + "' has " +
                       std::to_string(n) + ", not a multiple of 8; write --format gptq or "
                       "compressed-tensors");
    }
    out.add(q.module + ".qweight", pack_awq_qweight(q.values));
    out.add(q.module + ".qzeros", pack_awq_qzeros(k / q.block_size, n, 8));
    out.add(q.module + ".scales", linear_scale_f16_group_major(q, name()));
  }

  nlohmann::ordered_json quantization_config(const HfQuantSummary& s) const override {
    const auto [bits, block] = *s.schemes.begin();
    return {{"quant_method", "awq"},
            {"zero_point", true},
            {"group_size", block},
            {"bits", bits},
            {"version", "gemm"},
            {"modules_to_not_convert", s.ignore}};
  }

 private:
};

}  // namespace

std::unique_ptr<HfQuantLayout> make_awq_layout() { return std::make_unique<AwqLayout>(); }

}  // namespace qforge
