#include "exporters/modelopt/modelopt_writer.h"

#include <algorithm>

#include "exporters/quant_checkpoint/linear_values.h"
#include "ir/error.h"

namespace qforge {

Tensor pack_modelopt_int4(const Tensor& values) {
  if (values.dtype() != DType::I4 || values.rank() != 2 || values.shape()[0] % 2 != 0) {
    fail_internal("pack_modelopt_int4: " + std::string(dtype_name(values.dtype())) + " " +
                  shape_to_string(values.shape()) + " is not i4 [2m, K]");
  }
  const int64_t n = values.shape()[0], k = values.shape()[1];
  const uint8_t* in = values.data<uint8_t>().data();
  Tensor packed(DType::U8, {n / 2, k});
  uint8_t* out = packed.mutable_data<uint8_t>().data();
  // Byte (r, c): row 2r's stored nibble low, row 2r + 1's high (the signed value's low 4 bits,
  // which is what i4 stores).
  for (int64_t r = 0; r < n / 2; ++r) {
    const int64_t even = 2 * r * k, odd = even + k;
    uint8_t* o = out + r * k;
    if (k % 2 == 0) {  // both rows start on a byte: two columns per input byte
      const uint8_t* e = in + even / 2;
      const uint8_t* d = in + odd / 2;
      for (int64_t p = 0; p < k / 2; ++p) {
        o[2 * p] = static_cast<uint8_t>((e[p] & 0x0f) | ((d[p] & 0x0f) << 4));
        o[2 * p + 1] = static_cast<uint8_t>((e[p] >> 4) | (d[p] & 0xf0));
      }
      continue;
    }
    for (int64_t c = 0; c < k; ++c) {
      o[c] = static_cast<uint8_t>(int4_nibble(in, even + c) | (int4_nibble(in, odd + c) << 4));
    }
  }
  return packed;
}

namespace {

// What hf_quant_config.json's "producer" names.
constexpr std::string_view kProducer = "qforge";

class ModeloptHfLayout : public HfQuantLayout {
 public:
  std::string_view name() const override { return "modelopt-hf"; }

  void write_linear(const QuantizedLinearView& q, TensorSink& out) const override {
    const int64_t n = q.values.shape()[0], k = q.values.shape()[1];
    if (q.bits == 8) {  // W8A16: int8 [N, K], per-channel scale
      if (q.block_size > 0) {
        fail_unsupported("modelopt-hf writes int8 weights per channel (W8A16): '" + q.module +
                         "' has blocks of " + std::to_string(q.block_size));
      }
      out.add(q.module + ".weight", q.values);
      out.add(q.module + ".weight_scale", linear_scale_f32(q));
      return;
    }
    if (q.block_size <= 0 || k % q.block_size != 0) {
      fail_unsupported("modelopt-hf W4A16_AWQ needs groups that divide the input features: '" +
                       q.module + "' has " + std::to_string(k) + " and group " +
                       std::to_string(q.block_size));
    }
    if (n % 2 != 0) {
      fail_unsupported("modelopt-hf packs two output rows per byte: '" + q.module + "' has " +
                       std::to_string(n) + " output features, an odd number; write --format "
                       "compressed-tensors");
    }
    out.add(q.module + ".weight", pack_modelopt_int4(q.values));
    out.add(q.module + ".weight_scale", linear_scale_f32(q));
    const std::vector<float> one(static_cast<size_t>(k), 1.0f);
    out.add(q.module + ".pre_quant_scale", Tensor::from_f32(one, {k}, q.scale.dtype()));
  }

  nlohmann::ordered_json quantization_config(const HfQuantSummary& s) const override {
    const nlohmann::ordered_json q = quantization(s);
    nlohmann::ordered_json config = {{"ignore", q["exclude_modules"]},
                                     {"quant_algo", q["quant_algo"]},
                                     {"producer", producer()},
                                     {"quant_method", "modelopt"}};
    for (const char* key : {"group_size", "has_zero_point", "pre_quant_scale"}) {
      if (q.contains(key)) config[key] = q[key];
    }
    return config;
  }

  void write_side_files(const std::filesystem::path& dir,
                        const HfQuantSummary& s) const override {
    write_json(dir / "hf_quant_config.json",
               {{"producer", producer()}, {"quantization", quantization(s)}});
  }

 private:
  static nlohmann::ordered_json producer() { return {{"name", kProducer}}; }

  // hf_quant_config.json's "quantization", as ModelOpt's process_layer_quant_config writes it
  // for one scheme.
  static nlohmann::ordered_json quantization(const HfQuantSummary& s) {
    const auto [bits, block] = *s.schemes.begin();
    std::vector<std::string> exclude = s.ignore;
    std::sort(exclude.begin(), exclude.end());
    if (bits == 8) {
      return {{"quant_algo", "W8A16"},
              {"kv_cache_quant_algo", nullptr},
              {"exclude_modules", exclude}};
    }
    return {{"quant_algo", "W4A16_AWQ"},
            {"kv_cache_quant_algo", nullptr},
            {"group_size", block},
            {"has_zero_point", false},
            {"pre_quant_scale", true},
            {"exclude_modules", exclude}};
  }
};

}  // namespace

std::unique_ptr<HfQuantLayout> make_modelopt_hf_layout() {
  return std::make_unique<ModeloptHfLayout>();
}

}  // namespace qforge
