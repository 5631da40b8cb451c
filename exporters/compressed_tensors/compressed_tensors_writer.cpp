#include "exporters/compressed_tensors/compressed_tensors_writer.h"

#include <bit>
#include <cctype>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "ir/error.h"

namespace qforge {

namespace {

// The compressed-tensors release whose loader the interop tests hold this layout to.
constexpr std::string_view kFormatVersion = "0.20.0";

nlohmann::ordered_json config_group(int bits, int64_t block_size,
                                    nlohmann::ordered_json targets) {
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
  return {{"targets", std::move(targets)},
          {"weights", std::move(weights)},
          {"input_activations", nullptr},
          {"output_activations", nullptr},
          {"format", "pack-quantized"}};
}

// Regex metacharacters escaped, so that the text matches itself only.
std::string regex_escaped(std::string_view text) {
  std::string out;
  for (char c : text) {
    if (std::isalnum(static_cast<unsigned char>(c)) == 0 && c != '_') out += '\\';
    out += c;
  }
  return out;
}

}  // namespace

std::vector<std::string> module_targets(const std::vector<std::string>& modules) {
  // "prefix.<N>.suffix" -> the layer numbers N, by (prefix, suffix); names without a numbered
  // component as they are.
  std::map<std::pair<std::string, std::string>, std::set<int64_t>> numbered;
  std::set<std::string> plain;
  for (const std::string& m : modules) {
    size_t at = 0;
    bool found = false;
    while ((at = m.find('.', at)) != std::string::npos) {
      size_t end = at + 1;
      while (end < m.size() && std::isdigit(static_cast<unsigned char>(m[end])) != 0) ++end;
      const bool digits = end > at + 1 && end - at - 1 <= 9 && (end == m.size() || m[end] == '.');
      // a number without a leading zero, so that it reads back as the same text
      if (digits && (m[at + 1] != '0' || end == at + 2)) {
        numbered[{m.substr(0, at + 1), m.substr(end)}].insert(
            std::stoll(m.substr(at + 1, end - at - 1)));
        found = true;
        break;
      }
      ++at;
    }
    if (!found) plain.insert(m);
  }
  std::vector<std::string> out;
  for (const auto& [parts, numbers] : numbered) {
    std::string t = "re:^";
    t.append(regex_escaped(parts.first));
    if (numbers.size() > 1) t.append("(?:");
    for (int64_t n : numbers) {
      if (n != *numbers.begin()) t.push_back('|');
      t.append(std::to_string(n));
    }
    if (numbers.size() > 1) t.push_back(')');
    t.append(regex_escaped(parts.second));
    t.push_back('$');
    out.push_back(std::move(t));
  }
  for (const std::string& m : plain) {
    std::string t = "re:^";
    t.append(regex_escaped(m));
    t.push_back('$');
    out.push_back(std::move(t));
  }
  return out;
}

nlohmann::ordered_json compressed_tensors_config(
    const std::map<std::pair<int, int64_t>, std::vector<std::string>>& schemes,
    const std::vector<std::string>& ignore) {
  nlohmann::ordered_json groups = nlohmann::ordered_json::object();
  if (schemes.size() == 1) {  // one scheme: every Linear not ignored
    const auto& [scheme, modules] = *schemes.begin();
    groups["group_0"] = config_group(scheme.first, scheme.second, {"Linear"});
  } else {
    size_t i = 0;
    for (const auto& [scheme, modules] : schemes) {
      groups["group_" + std::to_string(i++)] =
          config_group(scheme.first, scheme.second, module_targets(modules));
    }
  }
  return {{"quant_method", "compressed-tensors"},
          {"format", schemes.size() > 1 ? "mixed-precision" : "pack-quantized"},
          {"quantization_status", "compressed"},
          {"config_groups", std::move(groups)},
          {"ignore", ignore},
          {"kv_cache_scheme", nullptr},
          {"global_compression_ratio", nullptr},
          {"sparsity_config", nlohmann::ordered_json::object()},
          {"version", kFormatVersion}};
}

namespace {

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
  bool mixed_schemes() const override { return true; }

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
    return compressed_tensors_config(s.modules, s.ignore);
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
