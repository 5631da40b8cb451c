#include "exporters/gptq/gptq_writer.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <regex>

#include "exporters/quant_checkpoint/linear_values.h"
#include "ir/error.h"

namespace qforge {

Tensor pack_gptq_qweight(const Tensor& values) {
  static_assert(std::endian::native == std::endian::little, "words are read as stored");
  if ((values.dtype() != DType::I4 && values.dtype() != DType::I8) || values.rank() != 2) {
    fail_internal("pack_gptq_qweight: " + std::string(dtype_name(values.dtype())) + " " +
                  shape_to_string(values.shape()) + " is not i4 or i8 [N, K]");
  }
  const int bits = values.dtype() == DType::I4 ? 4 : 8;
  const int per_word = 32 / bits;
  const int64_t n = values.shape()[0], k = values.shape()[1];
  if (k % per_word != 0) {
    fail_internal("pack_gptq_qweight: K = " + std::to_string(k) + " is not a multiple of " +
                  std::to_string(per_word));
  }
  // Word w of row r is the row's bytes [4w, 4w + 4) read little-endian: element per_word * w + j
  // is already at bits * j (i4 low nibble first, i8 byte by byte). The stored value q + 2^(bits-1)
  // of a field is q with the field's top bit flipped. qweight [K / per_word, N] is then the
  // transpose of the rows' words, taken in tiles that stay in cache.
  const uint32_t flip = bits == 4 ? 0x88888888u : 0x80808080u;
  const int64_t words = k / per_word;
  const uint8_t* in = values.data<uint8_t>().data();
  Tensor packed(DType::I32, {words, n});
  uint32_t* out = packed.mutable_data<uint32_t>().data();
  constexpr int64_t kTile = 64;
  for (int64_t w0 = 0; w0 < words; w0 += kTile) {
    const int64_t w1 = std::min(words, w0 + kTile);
    for (int64_t r0 = 0; r0 < n; r0 += kTile) {
      const int64_t r1 = std::min(n, r0 + kTile);
      for (int64_t w = w0; w < w1; ++w) {
        for (int64_t r = r0; r < r1; ++r) {
          uint32_t v;
          std::memcpy(&v, in + (r * words + w) * 4, 4);
          out[w * n + r] = v ^ flip;
        }
      }
    }
  }
  return packed;
}

Tensor pack_gptq_qzeros(int64_t groups, int64_t n, int bits, uint32_t zero) {
  const int per_word = 32 / bits;
  const int64_t words = (n + per_word - 1) / per_word;
  Tensor packed(DType::I32, {groups, words});
  auto out = packed.mutable_data<uint32_t>();
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t c = 0; c < n; ++c) {
      out[static_cast<size_t>(g * words + c / per_word)] |= zero << (bits * (c % per_word));
    }
  }
  return packed;
}

Tensor gptq_g_idx(int64_t k, int64_t group) {
  Tensor idx(DType::I32, {k});
  auto out = idx.mutable_data<int32_t>();
  for (int64_t i = 0; i < k; ++i) out[static_cast<size_t>(i)] = static_cast<int32_t>(i / group);
  return idx;
}

namespace {

std::string regex_escape(const std::string& s) {
  static const std::regex special(R"([.^$|()\[\]{}*+?\\])");
  return std::regex_replace(s, special, R"(\$&)");
}

class GptqLayout : public HfQuantLayout {
 public:
  explicit GptqLayout(bool v2) : v2_(v2) {}
  std::string_view name() const override { return v2_ ? "gptq-v2" : "gptq"; }

  void write_linear(const QuantizedLinearView& q, TensorSink& out) const override {
    const int64_t n = q.values.shape()[0], k = q.values.shape()[1];
    const int per_word = 32 / q.bits;
    if (k % per_word != 0) {
      fail_unsupported(std::string(name()) + " packs " + std::to_string(per_word) +
                       " input features per int32: '" + q.module + "' has " + std::to_string(k) +
                       "; write --format compressed-tensors");
    }
    const int64_t group = q.block_size > 0 ? q.block_size : k;
    const uint32_t zero = (1u << (q.bits - 1)) - (v2_ ? 0u : 1u);
    out.add(q.module + ".qweight", pack_gptq_qweight(q.values));
    out.add(q.module + ".qzeros", pack_gptq_qzeros(k / group, n, q.bits, zero));
    out.add(q.module + ".scales", linear_scale_f16_group_major(q, name()));
    out.add(q.module + ".g_idx", gptq_g_idx(k, group));
  }

  nlohmann::ordered_json quantization_config(const HfQuantSummary& s) const override {
    const auto [bits, block] = *s.schemes.begin();
    nlohmann::ordered_json dynamic = nlohmann::ordered_json::object();
    for (const std::string& m : s.ignore) {
      if (m != "lm_head") dynamic["-:^" + regex_escape(m) + "$"] = nlohmann::ordered_json::object();
    }
    nlohmann::ordered_json config = {{"quant_method", "gptq"},
                                     {"bits", bits},
                                     {"group_size", block > 0 ? block : -1},
                                     {"desc_act", false},
                                     {"sym", true},
                                     {"lm_head", false},
                                     {"true_sequential", true},
                                     {"checkpoint_format", v2_ ? "gptq_v2" : "gptq"},
                                     {"pack_dtype", "int32"},
                                     {"meta", {{"quantizer", {"qforge"}}}}};
    if (!dynamic.empty()) {
      config["dynamic"] = std::move(dynamic);
      // transformers loads GPTQ through optimum, which reads no `dynamic`: it would give every
      // Linear of the blocks a quantized layer, the float ones included. It quantizes only the
      // modules whose name ends with an entry of this list when the list is there (vLLM reads
      // it too, by substring), so the list names every quantized module in full.
      config["modules_in_block_to_quantize"] = nlohmann::ordered_json::array({s.quantized});
    }
    return config;
  }

 private:
  bool v2_;
};

}  // namespace

std::unique_ptr<HfQuantLayout> make_gptq_layout(bool v2) {
  return std::make_unique<GptqLayout>(v2);
}

}  // namespace qforge
