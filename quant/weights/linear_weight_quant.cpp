#include "quant/weights/linear_weight_quant.h"

#include <cmath>
#include <limits>
#include <algorithm>
#include <map>
#include <regex>
#include <vector>

#include <spdlog/spdlog.h>

#include "ir/error.h"
#include "ir/half.h"
#include "ir/quantized_linear.h"
#include "kernels/cpu/task_pool.h"
#include "kernels/device.h"
#include "kernels/int4_math.h"
#include "kernels/quantize.h"
#include "quant/calib/quant_error.h"
#include "quant/weights/f32_values.h"
#include "quant/weights/int4_group_quant.h"

namespace qforge {

namespace {

constexpr uint16_t kBf16MinSubnormal = 0x0001;
constexpr uint16_t kF16MinSubnormal = 0x0001;

bool is_float(DType d) { return d == DType::F32 || d == DType::F16 || d == DType::BF16; }

// A positive scale (amax / 127) in `dtype`, never rounded to 0 or Inf; returned as the float the
// stored scale holds.
float round_scale(float scale, DType dtype, uint16_t& bits) {
  if (dtype == DType::F16) {
    bits = f32_to_f16(scale);
    if ((bits & 0x7fff) == 0) bits = kF16MinSubnormal;
    if ((bits & 0x7fff) >= 0x7c00) bits = 0x7bff;
    return f16_to_f32(bits);
  }
  if (dtype == DType::BF16) {
    bits = f32_to_bf16(scale);
    if ((bits & 0x7fff) == 0) bits = kBf16MinSubnormal;
    if ((bits & 0x7fff) >= 0x7f80) bits = 0x7f7f;
    return bf16_to_f32(bits);
  }
  return scale;
}

// A positive scale moved onto fp16's grid (nearest, never 0 or Inf): rounding it to bf16 or f32
// afterwards keeps it there (bf16 keeps fewer significant bits at the same exponent).
float fp16_grid_scale(float scale) {
  uint16_t bits = 0;
  return round_scale(scale, DType::F16, bits);
}

// Error figures of q * scale against the float values, summed in double in element order.
struct ErrorSums {
  double max_abs = 0.0, signal = 0.0, noise = 0.0;
  void add(float w, float deq) {
    const double e = static_cast<double>(w) - static_cast<double>(deq);
    max_abs = std::max(max_abs, std::abs(e));
    signal += static_cast<double>(w) * w;
    noise += e * e;
  }
  LinearQuantStats stats() const {
    const double sqnr = noise == 0.0 ? std::numeric_limits<double>::infinity()
                                     : 10.0 * std::log10(signal / noise);
    return {max_abs, sqnr};
  }
};

LinearQuantStats quantize_int4(Graph& graph, const std::string& name, const Tensor& weight,
                               std::span<const float> w, const LinearWeightQuantOptions& o) {
  const int64_t out = weight.shape()[0], in = weight.shape()[1];
  const int64_t bs = o.block_size;
  const int64_t n = out * in;
  const int64_t blocks = n / bs;
  // The kernel blocks along rows and runs its scale search across columns: W [out, in] seen as
  // [blocks, bs] (in % bs == 0) and transposed to [bs, blocks] makes each block a column, so
  // the search vectorizes across blocks. Each column's values come in the same order as along
  // the row, so the scales are those of blocks along `in`.
  std::vector<uint16_t> s16(static_cast<size_t>(blocks));
  {
  std::vector<float> columns(static_cast<size_t>(n));
  constexpr int64_t kTile = 64;
  for (int64_t b0 = 0; b0 < blocks; b0 += kTile) {
    const int64_t b1 = std::min(blocks, b0 + kTile);
    for (int64_t r = 0; r < bs; ++r)
      for (int64_t b = b0; b < b1; ++b)
        columns[static_cast<size_t>(r * blocks + b)] = w[static_cast<size_t>(b * bs + r)];
  }
  std::vector<uint8_t> column_codes(static_cast<size_t>(int4_packed_bytes(n)));
  quantize_int4_blocked(columns, bs, blocks, bs, s16, column_codes, o.device, o.int4_scale);
  }
  Tensor values(DType::I4, {out, in});
  auto packed = values.mutable_data<uint8_t>();

  const DType dtype = weight.dtype();
  Tensor scale(dtype, {out, in / bs});
  std::vector<float> sf(s16.size());
  if (dtype == DType::BF16) {
    // fp16 -> bf16 may round: the codes below come from the scale that is stored.
    auto bits = scale.mutable_data<uint16_t>();
    for (size_t i = 0; i < s16.size(); ++i) {
      uint16_t b = f32_to_bf16(f16_to_f32(s16[i]));
      if ((b & 0x7fff) == 0) b = static_cast<uint16_t>((b & 0x8000) | kBf16MinSubnormal);
      bits[i] = b;
      sf[i] = bf16_to_f32(b);
    }
  } else {
    for (size_t i = 0; i < s16.size(); ++i) sf[i] = f16_to_f32(s16[i]);
    if (dtype == DType::F16) {
      std::copy(s16.begin(), s16.end(), scale.mutable_data<uint16_t>().begin());
    } else {
      std::copy(sf.begin(), sf.end(), scale.mutable_data<float>().begin());
    }
  }
  // Codes as the kernel computes them (int4_math::quantize_one), from the stored scale; pieces
  // of 64 KiB of codes on the task pool (kernels/cpu/task_pool.h).
  constexpr int64_t kPiece = int64_t{1} << 17;  // values (an even count)
  run_tasks(n >= kPiece ? cpu_threads() : 1, (n + kPiece - 1) / kPiece, [&](int64_t p, int) {
    for (int64_t i = p * kPiece; i < std::min(n, (p + 1) * kPiece); i += 2) {
      const float s0 = sf[static_cast<size_t>(i / bs)], s1 = sf[static_cast<size_t>((i + 1) / bs)];
      packed[static_cast<size_t>(i / 2)] = static_cast<uint8_t>(
          int4_math::nibble(int4_math::quantize_one(w[static_cast<size_t>(i)], s0)) |
          (int4_math::nibble(int4_math::quantize_one(w[static_cast<size_t>(i + 1)], s1)) << 4));
    }
  });
  ErrorSums err;
  for (int64_t i = 0; i < n; ++i) {
    const auto byte = packed[static_cast<size_t>(i / 2)];
    const int8_t q = int4_math::from_nibble(static_cast<uint8_t>(byte >> (4 * (i % 2))));
    err.add(w[static_cast<size_t>(i)], static_cast<float>(q) * sf[static_cast<size_t>(i / bs)]);
  }
  store_quantized_linear(graph, name, std::move(values), std::move(scale), bs);
  return err.stats();
}

LinearQuantStats quantize_int8(Graph& graph, const std::string& name, const Tensor& weight,
                               std::span<const float> w, const LinearWeightQuantOptions& o) {
  const int64_t out = weight.shape()[0], in = weight.shape()[1];
  std::vector<float> amaxes(static_cast<size_t>(out));
  amax_per_channel(w, 1, out, in, amaxes, o.device);
  const DType dtype = weight.dtype();
  Tensor scale(dtype, {out});
  std::vector<float> sf(amaxes.size());
  for (size_t c = 0; c < amaxes.size(); ++c) {
    uint16_t bits = 0;
    float s = int8_symmetric_scale(amaxes[c]);
    if (o.fp16_scales) s = fp16_grid_scale(s);
    sf[c] = round_scale(s, dtype, bits);
    if (dtype == DType::F32) {
      scale.mutable_data<float>()[c] = sf[c];
    } else {
      scale.mutable_data<uint16_t>()[c] = bits;
    }
  }
  Tensor values(DType::I8, {out, in});
  const auto q = values.mutable_data<int8_t>();
  quantize_int8(w, 1, out, in, sf, q, o.device);
  ErrorSums err;
  for (int64_t i = 0; i < out * in; ++i) {
    err.add(w[static_cast<size_t>(i)],
            static_cast<float>(q[static_cast<size_t>(i)]) * sf[static_cast<size_t>(i / in)]);
  }
  store_quantized_linear(graph, name, std::move(values), std::move(scale), 0);
  return err.stats();
}

// The largest of 128, 64, 32 dividing every `in`, or 0.
int64_t fitting_block_size(const std::vector<int64_t>& ins) {
  for (int64_t bs : {128, 64, 32}) {
    bool fits = true;
    for (int64_t k : ins) fits = fits && k % bs == 0;
    if (fits) return bs;
  }
  return 0;
}

class LinearWeightQuantPass final : public Pass {
 public:
  explicit LinearWeightQuantPass(LinearWeightQuantOptions options) : options_(options) {}
  std::string_view name() const override {
    return options_.bits == 4 ? "w4a16-linear" : "int8-weights-linear";
  }
  void run(Graph& graph, PassReport& report) override {
    const LinearWeightPlan plan = plan_linear_weight_quant(graph, options_);
    report.stats["quantized"] = 0;
    for (size_t i = 0; i < plan.quantize.size(); ++i) {
      const std::string& w = plan.quantize[i];
      const Tensor before = *graph.find_initializer(w);
      LinearWeightQuantOptions one = options_;
      one.bits = plan.bits[i];
      const LinearQuantStats s = quantize_linear_weight(graph, w, one);
      nlohmann::ordered_json row;
      row["name"] = w;
      row["shape"] = before.shape();
      row["dtype"] = std::string(dtype_name(before.dtype()));
      row["bits"] = one.bits;
      row["block_size"] = one.bits == 4 ? one.block_size : 0;
      row["max_abs_error"] = s.max_abs_error;
      row["sqnr_db"] = sqnr_text(s.sqnr_db);
      report.stats["tensors"].push_back(std::move(row));
      report.count("quantized");
    }
    for (const auto& k : plan.kept) report.stats["float_linears"].push_back(k.name);
  }

 private:
  LinearWeightQuantOptions options_;
};

}  // namespace

LinearWeightPlan plan_linear_weight_quant(const Graph& weights,
                                          const LinearWeightQuantOptions& options) {
  if (options.bits != 4 && options.bits != 8) {
    fail_internal("linear weight quantization: " + std::to_string(options.bits) + " bits");
  }
  std::vector<std::regex> rules;
  rules.reserve(kDecoderLinearRules.size());
  for (const auto& rule : kDecoderLinearRules) rules.emplace_back(std::string(rule.pattern));
  const PrecisionRules precision(options.precision, options.bits == 4 ? LinearPrecision::Int4
                                                                      : LinearPrecision::Int8);
  std::vector<int64_t> rule_matches(options.precision.size(), 0);
  // fused group key -> (module, precision) of its first member
  std::map<std::string, std::pair<std::string, LinearPrecision>> fused;
  LinearWeightPlan plan;
  std::vector<int64_t> ins;
  std::string misfit;  // the first weight whose `in` the block size does not divide
  for (const auto& [name, tensor] : weights.initializers()) {
    size_t r = 0;
    while (r < rules.size() && !std::regex_match(name, rules[r])) ++r;
    if (r == rules.size()) continue;
    const LinearWeightRule& rule = kDecoderLinearRules[r];
    if (rule.action == LinearRuleAction::KeepFloat) {
      plan.kept.push_back({name, std::string(rule.what)});
      continue;
    }
    const std::string module = name.substr(0, name.size() - std::string_view(".weight").size());
    int chosen = -1;
    const LinearPrecision p = precision.of(module, &chosen);
    if (chosen >= 0) ++rule_matches[static_cast<size_t>(chosen)];
    if (const std::string key = fused_group_key(module); !key.empty()) {
      const auto [it, first] = fused.emplace(key, std::make_pair(module, p));
      if (!first && it->second.second != p) {
        fail_usage("--precision gives '" + it->second.first + "' " +
                   std::string(linear_precision_name(it->second.second)) + " and '" + module +
                   "' " + std::string(linear_precision_name(p)) +
                   ", parts of one Linear that engines fuse (" + key +
                   "): give them one precision");
      }
    }
    if (p == LinearPrecision::Float) {
      plan.kept.push_back(
          {name, "--precision " + precision_rule_text(options.precision[static_cast<size_t>(
                                      chosen)]) + " keeps it float"});
      continue;
    }
    const int bits = linear_precision_bits(p);
    if (tensor.rank() != 2 || !is_float(tensor.dtype()) || tensor.numel() == 0) {
      fail_usage("'" + name + "' (a " + std::string(rule.what) + ") is " +
                 std::string(dtype_name(tensor.dtype())) + " " + shape_to_string(tensor.shape()) +
                 ": only non-empty 2-D f32, f16 or bf16 Linear weights are quantized; convert "
                 "the folder without --quant");
    }
    const int64_t in = tensor.shape()[1];
    if (bits == 4) ins.push_back(in);
    if (bits == 4 && in % options.block_size != 0 && misfit.empty()) {
      misfit = "'" + name + "' " + shape_to_string(tensor.shape()) + " has " +
               std::to_string(in) + " input features";
    }
    plan.quantize.push_back(name);
    plan.bits.push_back(bits);
  }
  for (size_t i = 0; i < rule_matches.size(); ++i) {
    if (rule_matches[i] == 0) {
      fail_usage("--precision '" + precision_rule_text(options.precision[i]) +
                 "' matches no decoder Linear (an earlier rule may take them; modules are "
                 "named like model.layers.0.mlp.down_proj): fix the regex or drop the rule");
    }
  }
  if (!misfit.empty()) {
    const int64_t fits = fitting_block_size(ins);
    fail_usage(misfit + ", not a multiple of --block-size " + std::to_string(options.block_size) +
               (fits != 0 ? ": pass --block-size " + std::to_string(fits) +
                                ", which divides every int4 Linear weight's input features"
                          : ": no block size of 32, 64 or 128 divides every Linear weight's "
                            "input features; use --quant int8-weights (per output channel)"));
  }
  return plan;
}

LinearQuantStats quantize_linear_weight(Graph& weights, const std::string& name,
                                        const LinearWeightQuantOptions& options) {
  const Tensor* found = weights.find_initializer(name);
  if (found == nullptr) fail_internal("quantize_linear_weight: no initializer '" + name + "'");
  const Tensor weight = *found;
  if (options.bits == 4 && !kernel_uses_cuda(options.device)) {
    // The CPU's fused path: the same bytes as quantize_int4 below with the CPU kernel.
    Int4GroupQuant q = quantize_int4_groups(weight, options.block_size, options.int4_scale);
    if (!q.finite) fail_invalid("Linear weight '" + name + "' holds NaN or Inf: fix the model");
    store_quantized_linear(weights, name, std::move(q.values), std::move(q.scale),
                           options.block_size);
    const double sqnr = q.noise == 0.0 ? std::numeric_limits<double>::infinity()
                                       : 10.0 * std::log10(q.signal / q.noise);
    return {q.max_abs_error, sqnr};
  }
  const F32Values values(weight);
  if (!std::isfinite(amax(values.span(), options.device))) {
    fail_invalid("Linear weight '" + name + "' holds NaN or Inf: fix the model");
  }
  return options.bits == 4 ? quantize_int4(weights, name, weight, values.span(), options)
                           : quantize_int8(weights, name, weight, values.span(), options);
}

std::unique_ptr<Pass> make_linear_weight_quant_pass(LinearWeightQuantOptions options) {
  return std::make_unique<LinearWeightQuantPass>(options);
}

}  // namespace qforge
