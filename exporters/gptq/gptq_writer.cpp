#include "exporters/gptq/gptq_writer.h"

#include <regex>

#include "exporters/quant_checkpoint/linear_values.h"
#include "ir/error.h"

namespace qforge {

Tensor pack_gptq_qweight(const Tensor& values) {
  const std::vector<int8_t> q = signed_linear_values(values);
  const int bits = values.dtype() == DType::I4 ? 4 : 8;
  const int per_word = 32 / bits;
  const int64_t n = values.shape()[0], k = values.shape()[1];
  if (k % per_word != 0) {
    fail_internal("pack_gptq_qweight: K = " + std::to_string(k) + " is not a multiple of " +
                  std::to_string(per_word));
  }
  const uint32_t mask = (1u << bits) - 1;
  const uint32_t offset = 1u << (bits - 1);
  Tensor packed(DType::I32, {k / per_word, n});
  auto out = packed.mutable_data<uint32_t>();
  for (int64_t w = 0; w < k / per_word; ++w) {
    for (int64_t r = 0; r < n; ++r) {
      uint32_t word = 0;
      for (int j = 0; j < per_word; ++j) {
        const auto v = static_cast<uint32_t>(q[static_cast<size_t>(r * k + w * per_word + j)]);
        word |= ((v + offset) & mask) << (bits * j);
      }
      out[static_cast<size_t>(w * n + r)] = word;
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
