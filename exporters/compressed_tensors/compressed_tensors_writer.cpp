#include "exporters/compressed_tensors/compressed_tensors_writer.h"

#include <bit>

#include <nlohmann/json.hpp>

#include "ir/error.h"

namespace qforge {

namespace {

// The compressed-tensors release whose loader the interop tests hold this layout to.
constexpr std::string_view kFormatVersion = "0.20.0";

nlohmann::ordered_json compressed_tensors_config(int bits, int64_t block_size,
                                                 const std::vector<std::string>& ignore) {
  nlohmann::ordered_json weights = {
      {"num_bits", bits},
      {"type", "int"},
      {"symmetric", true},
      {"strategy", block_size > 0 ? "group" : "channel"},
      {"group_size", block_size > 0 ? nlohmann::ordered_json(block_size) : nullptr},
      {"block_structure", nullptr},
      {"dynamic", false},
      {"actorder", nullptr},
      {"observer", "minmax"},
      {"observer_kwargs", nlohmann::ordered_json::object()},
  };
  nlohmann::ordered_json group = {{"targets", {"Linear"}},
                                  {"weights", std::move(weights)},
                                  {"input_activations", nullptr},
                                  {"output_activations", nullptr},
                                  {"format", "pack-quantized"}};
  return {{"quant_method", "compressed-tensors"},
          {"format", "pack-quantized"},
          {"quantization_status", "compressed"},
          {"config_groups", {{"group_0", std::move(group)}}},
          {"ignore", ignore},
          {"kv_cache_scheme", nullptr},
          {"global_compression_ratio", nullptr},
          {"sparsity_config", nlohmann::ordered_json::object()},
          {"version", kFormatVersion}};
}

}  // namespace

Tensor pack_quantized_int32(const Tensor& values) {
  if ((values.dtype() != DType::I4 && values.dtype() != DType::I8) || values.rank() != 2) {
    fail_internal("pack_quantized_int32: " + std::string(dtype_name(values.dtype())) + " " +
                  shape_to_string(values.shape()) + " is not i4 or i8 [N, K]");
  }
  const int bits = values.dtype() == DType::I4 ? 4 : 8;
  const int64_t n = values.shape()[0], k = values.shape()[1];
  const int64_t words = (k * bits + 31) / 32;
  const int per_word = 32 / bits;
  const uint32_t mask = (1u << bits) - 1;
  const uint32_t offset = 1u << (bits - 1);
  Tensor packed(DType::I32, {n, words});
  auto out = packed.mutable_data<uint32_t>();
  const auto in = values.data<uint8_t>();
  if (bits == 4 && k % 8 == 0 && std::endian::native == std::endian::little) {
    // Whole words per row: word i holds the nibbles of bytes 4i .. 4i + 3 in the same order, and
    // (q + 8) & 15 == (q & 15) ^ 8, so each word's bytes are the I4 bytes with both nibbles
    // flipped at bit 3.
    auto* o = reinterpret_cast<uint8_t*>(out.data());
    for (size_t i = 0; i < in.size(); ++i) o[i] = static_cast<uint8_t>(in[i] ^ 0x88u);
    return packed;
  }
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t c = 0; c < k; ++c) {
      const int64_t e = r * k + c;
      int32_t q = 0;
      if (bits == 4) {
        const int nib = (in[static_cast<size_t>(e / 2)] >> (4 * (e % 2))) & 0x0f;
        q = nib >= 8 ? nib - 16 : nib;
      } else {
        q = static_cast<int8_t>(in[static_cast<size_t>(e)]);
      }
      const uint32_t u = (static_cast<uint32_t>(q) + offset) & mask;
      out[static_cast<size_t>(r * words + c / per_word)] |= u << (bits * (c % per_word));
    }
  }
  return packed;
}

namespace {

class CompressedTensorsLayout : public HfQuantLayout {
 public:
  std::string_view name() const override { return "compressed-tensors"; }

  void write_linear(const QuantizedLinearView& q, TensorSink& out) const override {
    out.add(q.module + ".weight_packed", pack_quantized_int32(q.values));
    if (q.block_size > 0) {
      out.add(q.module + ".weight_scale", q.scale);
    } else {  // per channel: [N] -> [N, 1], the same bytes
      out.add(q.module + ".weight_scale", Tensor(q.scale.dtype(), {q.scale.shape()[0], 1},
                                                 q.scale.storage(), q.scale.offset()));
    }
    Tensor shape(DType::I64, {2});
    shape.mutable_data<int64_t>()[0] = q.values.shape()[0];
    shape.mutable_data<int64_t>()[1] = q.values.shape()[1];
    out.add(q.module + ".weight_shape", shape);
  }

  nlohmann::ordered_json quantization_config(const HfQuantSummary& s) const override {
    const auto [bits, block] = *s.schemes.begin();
    return compressed_tensors_config(bits, block, s.ignore);
  }
};

}  // namespace

std::unique_ptr<HfQuantLayout> make_compressed_tensors_layout() {
  return std::make_unique<CompressedTensorsLayout>();
}

void write_compressed_tensors(const Graph& weights, const std::filesystem::path& out,
                              const CompressedTensorsOptions& options) {
  CompressedTensorsWriter writer(out, options);
  writer.add(weights);
  writer.finish();
}

}  // namespace qforge
