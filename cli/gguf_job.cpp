#include "cli/gguf_job.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <set>

#include <spdlog/spdlog.h>

#include "cli/app.h"
#include "cli/gguf_llama_map.h"
#include "exporters/gguf/gguf_writer.h"
#include "importers/hf/hf_decoder_facts.h"
#include "importers/hf/hf_tokenizer.h"
#include "importers/load_model.h"
#include "ir/error.h"
#include "ir/half.h"
#include "ir/page_release.h"
#include "ir/quantized_linear.h"
#include "kernels/cpu_threads_scope.h"
#include "kernels/gguf_quants.h"

namespace qforge::cli {

namespace {

// The convert flags a GGUF export reads; any other given flag is a usage error, not ignored.
const std::set<std::string> kGgufFlags = {"--format",  "--quant",   "--output",
                                          "--overwrite", "--config", "--threads",
                                          "--device",  "--requantize"};

void check_gguf_options(const ConvertOptions& p) {
  if (p.format != "gguf") {
    fail_usage("--quant " + p.quant + " is a GGUF type: add --format gguf (or use none, "
               "int8-weights, int8 or w4a16 for ONNX, safetensors and bundles)");
  }
  for (const auto& flag : p.given) {
    if (!kGgufFlags.contains(flag)) {
      fail_usage(flag + " is not used by --format gguf (it takes --quant f32|f16|q8_0|q4_0|q4_1 "
                 "and -o model.gguf)");
    }
  }
  if (p.quant != "none" && find_gguf_out_type(p.quant) == nullptr) {
    fail_usage("--quant " + p.quant + " does not go with --format gguf: use " +
               "f32, f16, q8_0, q4_0 or q4_1");
  }
  if (!p.output.ends_with(".gguf")) {
    fail_usage("-o '" + p.output + "': a --format gguf output is one file named *.gguf");
  }
  if (!is_hf_folder(p.input)) {
    fail_usage("'" + p.input + "' is not a Hugging Face model folder (config.json, weights, "
               "tokenizer.json); --format gguf reads one");
  }
}

// `arch`: the converter writes add_space_prefix for the Llama family (llama, Mistral) only.
void add_tokenizer(gguf::GgufWriter& w, const HfTokenizer& t, const std::string& arch) {
  if (t.add_space_prefix && arch == "llama") {
    w.add_bool("tokenizer.ggml.add_space_prefix", *t.add_space_prefix);
  }
  w.add_string("tokenizer.ggml.model", t.model);
  w.add_string("tokenizer.ggml.pre", t.pre);
  w.add_string_array("tokenizer.ggml.tokens", t.tokens);
  if (!t.scores.empty()) w.add_f32_array("tokenizer.ggml.scores", t.scores);
  w.add_i32_array("tokenizer.ggml.token_type", t.token_types);
  if (!t.merges.empty()) w.add_string_array("tokenizer.ggml.merges", t.merges);
  for (const auto& [name, id] : t.special_ids) {
    w.add_u32("tokenizer.ggml." + name + "_token_id", id);
  }
  if (t.add_bos) w.add_bool("tokenizer.ggml.add_bos_token", *t.add_bos);
  if (t.add_eos) w.add_bool("tokenizer.ggml.add_eos_token", *t.add_eos);
  if (!t.chat_template.empty()) w.add_string("tokenizer.chat_template", t.chat_template);
}

// The source row each output row takes under the RoPE regrouping (permute_rope_rows on indices).
std::vector<int64_t> rope_row_order(int64_t rows, int64_t heads) {
  std::vector<float> index(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) index[static_cast<size_t>(r)] = static_cast<float>(r);
  const std::vector<float> permuted = permute_rope_rows(index, rows, 1, heads);
  return std::vector<int64_t>(permuted.begin(), permuted.end());
}

// A tensor's rows as float32, read from the (memory-mapped) checkpoint a row at a time by the
// encoding threads, so that a large embedding is never held whole in float32. Rows that the
// RoPE permutation regroups are read in their regrouped order (rope_row_order), in place.
// Dtypes other than f32, f16 and bf16 are converted whole first.
class SourceRows {
 public:
  SourceRows(const Tensor& t, int64_t cols, int64_t permute_heads) : t_(t), cols_(cols) {
    if (permute_heads > 0) {
      order_ = rope_row_order(static_cast<int64_t>(t.numel()) / cols, permute_heads);
    }
    if (t.dtype() != DType::F32 && t.dtype() != DType::F16 && t.dtype() != DType::BF16) {
      whole_ = t.to_f32();
    }
  }

  // Thread-safe: reads the tensor, writes only `out`.
  void row(int64_t r, std::span<float> out) const {
    const int64_t src = order_.empty() ? r : order_[static_cast<size_t>(r)];
    const auto at = static_cast<size_t>(src * cols_);
    const auto n = static_cast<size_t>(cols_);
    if (!whole_.empty()) {
      std::copy_n(whole_.begin() + static_cast<std::ptrdiff_t>(at), n, out.begin());
    } else if (t_.dtype() == DType::F32) {
      std::copy_n(t_.data<float>().begin() + static_cast<std::ptrdiff_t>(at), n, out.begin());
    } else {
      const uint16_t* half = t_.data<uint16_t>().subspan(at, n).data();
      float* o = out.data();
      if (t_.dtype() == DType::F16) {  // one loop per dtype, so that bf16's shift vectorizes
        for (size_t i = 0; i < n; ++i) o[i] = f16_to_f32(half[i]);
      } else {
        for (size_t i = 0; i < n; ++i) o[i] = bf16_to_f32(half[i]);
      }
    }
  }

 private:
  const Tensor& t_;
  int64_t cols_;
  std::vector<int64_t> order_;
  std::vector<float> whole_;
};

// --- A quantized checkpoint's Linears (ir/quantized_linear.h) as GGUF blocks -----------------
// Q4_0, Q4_1 and Q8_0 hold a symmetric integer weight with one fp16 scale per 32 values exactly
// (kernels/gguf_quants.h gguf_encode_levels_row), so a checkpoint quantized elsewhere (GPTQ,
// AWQ, compressed-tensors) becomes GGUF without a second rounding when its scales are fp16
// values and its groups whole blocks of 32.

struct StoredLinear {
  const Tensor* values = nullptr;  // i4 or i8 [out, in]
  const Tensor* scale = nullptr;   // [out, in / block] or [out]
  int bits = 0;
  int64_t block = 0;  // 0: one scale per row
};

std::optional<StoredLinear> stored_linear(const Graph& g, const std::string& name) {
  const QuantRecord* r = g.find_quant_record(name);
  if (r == nullptr || !r->reader.empty()) return std::nullopt;
  return StoredLinear{g.find_initializer(r->name), g.find_initializer(r->scale), r->bits,
                      r->block_size};
}

std::string scheme_name(const StoredLinear& s) {
  return "int" + std::to_string(s.bits) +
         (s.block > 0 ? " group " + std::to_string(s.block) : std::string(" per channel"));
}

// Why `type` cannot hold `s` exactly; empty when it can.
std::string why_not_exact(const StoredLinear& s, gguf::TensorType type) {
  const std::string_view tname = gguf::tensor_type_info(type).name;
  if (type == gguf::TensorType::F32) return {};  // q * scale, in the scale's dtype, widened
  if (type == gguf::TensorType::F16) {
    if (s.scale->dtype() == DType::F16) return {};
    return "its " + std::string(dtype_name(s.scale->dtype())) +
           " scales make q * scale a value F16 may not hold";
  }
  const bool four = type == gguf::TensorType::Q4_0 || type == gguf::TensorType::Q4_1;
  if (four && s.bits != 4) return scheme_name(s) + " levels do not fit " + std::string(tname);
  if (type != gguf::TensorType::Q8_0 && !four) return std::string(tname) + " is not written";
  if (s.block % 32 != 0) {
    return "its groups of " + std::to_string(s.block) + " are not whole " + std::string(tname) +
           " blocks of 32";
  }
  for (const float v : s.scale->to_f32()) {
    const float d = f16_to_f32(f32_to_f16(v));
    if (d != v || !std::isfinite(d)) {
      return "its scale " + std::to_string(v) + " is not an fp16 value (" +
             std::string(dtype_name(s.scale->dtype())) + " scales)";
    }
    if (type == gguf::TensorType::Q4_1 && !std::isfinite(f16_to_f32(f32_to_f16(-8.0f * v)))) {
      return "its scale " + std::to_string(v) + " times 8 (Q4_1's minimum) overflows fp16";
    }
  }
  return {};
}

gguf::TensorType natural_type(const StoredLinear& s) {
  return s.bits == 4 ? gguf::TensorType::Q4_0 : gguf::TensorType::Q8_0;
}

// Writes the rows of `s` (in the order `row_order` gives, all rows when empty) as `type`.
void encode_stored_linear(const StoredLinear& s, gguf::TensorType type,
                          std::span<const int64_t> row_order, std::span<std::byte> dst) {
  const int64_t out = s.values->shape()[0], in = s.values->shape()[1];
  const int64_t groups = s.block > 0 ? in / s.block : 1;
  const int64_t group = s.block > 0 ? s.block : in;
  const std::vector<float> scales = s.scale->to_f32();
  const auto bytes = s.values->data<uint8_t>();
  const uint64_t row_bytes = gguf_row_bytes(type, static_cast<uint64_t>(in));
  std::vector<int8_t> q(static_cast<size_t>(in));
  std::vector<uint16_t> d(static_cast<size_t>(in / 32));
  for (int64_t r = 0; r < out; ++r) {
    const int64_t src = row_order.empty() ? r : row_order[static_cast<size_t>(r)];
    for (int64_t c = 0; c < in; ++c) {
      const int64_t e = src * in + c;
      if (s.bits == 4) {
        const int nib = (bytes[static_cast<size_t>(e / 2)] >> (4 * (e % 2))) & 0x0f;
        q[static_cast<size_t>(c)] = static_cast<int8_t>(nib >= 8 ? nib - 16 : nib);
      } else {
        q[static_cast<size_t>(c)] = static_cast<int8_t>(bytes[static_cast<size_t>(e)]);
      }
    }
    for (int64_t b = 0; b < in / 32; ++b) {
      const float v = scales[static_cast<size_t>(src * groups + b * 32 / group)];
      d[static_cast<size_t>(b)] = f32_to_f16(v);
    }
    gguf_encode_levels_row(type, q, d, dst.subspan(static_cast<size_t>(r) * row_bytes, row_bytes));
  }
}

std::string model_name(const std::string& input) {
  std::filesystem::path p(input);
  if (!p.has_filename()) p = p.parent_path();
  return p.filename().string();
}

// --quant for a GGUF export: given, or llama.cpp's converter default (f16) for float weights;
// for a quantized checkpoint without --quant, the type that holds most of its Linears as stored.
const GgufOutType& gguf_out_type(const ConvertOptions& p, const LoadedModel& loaded) {
  if (p.quant != "none") return *find_gguf_out_type(p.quant);
  if (!loaded.quantized) return *find_gguf_out_type("f16");
  int64_t four = 0, eight = 0;
  for (const QuantizedScheme& s : loaded.quantized->schemes) (s.bits == 4 ? four : eight) += s.linears;
  return *find_gguf_out_type(four >= eight ? "q4_0" : "q8_0");
}

}  // namespace

bool is_gguf_quant(const std::string& quant) { return find_gguf_out_type(quant) != nullptr; }

ConvertResult export_gguf(const ConvertOptions& p) {
  check_gguf_options(p);
  const CpuThreadsScope threads(p.threads);  // the encoding's threads (--threads)
  LoadedModel loaded = load_model(p.input);
  if (p.requantize && !loaded.quantized) {
    fail_usage("--requantize is for an already quantized model folder; '" + p.input +
               "' holds float weights (use --quant alone)");
  }
  const GgufOutType& out = gguf_out_type(p, loaded);
  const HfConfig& config = *loaded.hf_config;
  const std::string arch = gguf_architecture(config);
  const HfDecoderFacts facts = read_hf_decoder_facts(p.input);
  const HfTokenizer tokenizer = read_hf_tokenizer(p.input, config.vocab_size);
  if (!tokenizer.pre_reason.empty()) {
    spdlog::warn("tokenizer.ggml.pre is 'default': {} (llama.cpp will warn that generation "
                 "quality may be degraded)",
                 tokenizer.pre_reason);
  }
  std::vector<GgufTensorPlan> plan = plan_llama_gguf(loaded.graph, config, out);

  // A quantized checkpoint's Linears keep their integers and scales where the planned type holds
  // them (or, with no --quant, the type that does); any other is refused before anything is
  // written, unless --requantize.
  std::set<std::string> as_stored_names;  // quantized Linears encoded from their own levels
  std::vector<std::string> requantized;
  for (GgufTensorPlan& t : plan) {
    const std::optional<StoredLinear> s = stored_linear(loaded.graph, t.source);
    if (!s) continue;
    std::string why = why_not_exact(*s, t.type);
    if (!why.empty() && p.quant == "none" && why_not_exact(*s, natural_type(*s)).empty()) {
      t.type = natural_type(*s);
      why.clear();
    }
    if (why.empty()) {
      // F32/F16 hold the dequantized weight, q * scale, exactly: written from it
      if (t.type != gguf::TensorType::F32 && t.type != gguf::TensorType::F16) {
        as_stored_names.insert(t.source);
      }
    } else if (p.requantize) {
      requantized.push_back(t.source);
    } else {
      fail_unsupported(
          "'" + t.source + "' is stored " + scheme_name(*s) + " in '" + p.input + "', and " +
          std::string(gguf::tensor_type_info(t.type).name) + " cannot hold it as stored: " + why +
          ". Pass the --quant that holds it (q4_0 or q8_0 for fp16 scales in groups of 32), or "
          "--requantize to dequantize and quantize again (a second rounding error)");
    }
  }
  if (!requantized.empty()) {
    spdlog::info("--requantize: {} quantized Linears of '{}' dequantized and quantized again as "
                 "{} (first: '{}')",
                 requantized.size(), p.input, out.name, requantized.front());
  }

  gguf::GgufWriter writer;
  add_llama_metadata(writer, config, facts, model_name(p.input), out);
  add_tokenizer(writer, tokenizer, arch);
  for (const auto& t : plan) {
    std::vector<uint64_t> ne(t.shape.rbegin(), t.shape.rend());
    writer.add_tensor(t.name, std::move(ne), t.type);
  }

  PassReport report;
  report.pass = "gguf-export";
  nlohmann::ordered_json table = nlohmann::ordered_json::array();
  uint64_t bytes_in = 0;
  uint64_t bytes_out = 0;
  writer.write(p.output, [&](size_t i, std::span<std::byte> dst) {
    const GgufTensorPlan& t = plan[i];
    const Tensor& src = *loaded.graph.find_initializer(t.source);
    const int64_t cols = t.shape.back();
    const int64_t rows = static_cast<int64_t>(src.numel()) / cols;
    const std::optional<StoredLinear> stored = stored_linear(loaded.graph, t.source);
    const bool as_stored = as_stored_names.contains(t.source);
    if (as_stored) {
      const std::vector<int64_t> order =
          t.permute_heads > 0 ? rope_row_order(rows, t.permute_heads) : std::vector<int64_t>{};
      encode_stored_linear(*stored, t.type, order, dst);
      bytes_in += src.nbytes() + stored->scale->nbytes();
    } else {
      // Float weights, and a quantized Linear written as F32/F16 or requantized: q * scale in
      // the scale's dtype, as the checkpoint's loaders compute it.
      const Tensor weight = stored ? dequantize_quantized_linear(
                                         loaded.graph, *loaded.graph.find_quant_record(t.source))
                                   : src;
      const SourceRows source(weight, cols, t.permute_heads);
      gguf_quantize_rows(
          t.type, rows, cols, [&source](int64_t r, std::span<float> out) { source.row(r, out); },
          dst);
      bytes_in += src.nbytes() + (stored ? stored->scale->nbytes() : 0);
    }
    // Done with this tensor: its mapped pages need not stay resident (ir/page_release.h).
    release_tensor_pages(src);
    bytes_out += dst.size();
    table.push_back({{"name", t.name},
                    {"source", t.source},
                    {"shape", t.shape},
                    {"dtype", std::string(dtype_name(src.dtype()))},
                    {"type", std::string(gguf::tensor_type_info(t.type).name)},
                    {"as_stored", as_stored},
                    {"bytes", dst.size()}});
  });
  report.stats["architecture"] = arch;
  report.stats["type"] = std::string(out.name);
  report.stats["tensors_written"] = plan.size();
  report.stats["metadata_keys"] = writer.kv_count();
  report.stats["tokenizer_pre"] = tokenizer.pre;
  if (loaded.quantized) {
    report.stats["quantized_linears_as_stored"] = as_stored_names.size();
    report.stats["quantized_linears_requantized"] = requantized.size();
  }
  report.stats["gguf_tensors"] = std::move(table);
  ConvertResult result;
  result.weights_bytes_in = bytes_in;
  result.weights_bytes_out = bytes_out;
  result.report.passes.push_back(std::move(report));
  return result;
}

}  // namespace qforge::cli
