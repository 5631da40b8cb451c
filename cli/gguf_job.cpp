#include "cli/gguf_job.h"

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
#include "kernels/gguf_quants.h"

namespace qforge::cli {

namespace {

// The convert flags a GGUF export reads; any other given flag is a usage error, not ignored.
const std::set<std::string> kGgufFlags = {"--format", "--quant", "--output", "--overwrite",
                                          "--config", "--threads", "--device"};

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

// One tensor's rows as float32, read from the (memory-mapped) checkpoint a row at a time, so
// that a large embedding is never held twice in float32. Rows that the RoPE permutation
// regroups are converted whole (Q and K are hidden x hidden at most).
class SourceRows {
 public:
  SourceRows(const Tensor& t, int64_t cols, int64_t permute_heads) : t_(t), cols_(cols) {
    if (permute_heads > 0) {
      whole_ = permute_rope_rows(t.to_f32(), static_cast<int64_t>(t.numel()) / cols, cols,
                                 permute_heads);
    } else if (t.dtype() != DType::F32 && t.dtype() != DType::F16 && t.dtype() != DType::BF16) {
      whole_ = t.to_f32();
    }
    row_.resize(static_cast<size_t>(cols));
  }

  std::span<const float> row(int64_t r) {
    const auto at = static_cast<size_t>(r * cols_);
    const auto n = static_cast<size_t>(cols_);
    if (!whole_.empty()) return std::span<const float>(whole_).subspan(at, n);
    if (t_.dtype() == DType::F32) return t_.data<float>().subspan(at, n);
    const auto half = t_.data<uint16_t>().subspan(at, n);
    for (size_t i = 0; i < n; ++i) {
      row_[i] = t_.dtype() == DType::F16 ? f16_to_f32(half[i]) : bf16_to_f32(half[i]);
    }
    return row_;
  }

 private:
  const Tensor& t_;
  int64_t cols_;
  std::vector<float> whole_;
  std::vector<float> row_;
};

std::string model_name(const std::string& input) {
  std::filesystem::path p(input);
  if (!p.has_filename()) p = p.parent_path();
  return p.filename().string();
}

}  // namespace

bool is_gguf_quant(const std::string& quant) { return find_gguf_out_type(quant) != nullptr; }

ConvertResult export_gguf(const ConvertOptions& p) {
  check_gguf_options(p);
  // --quant none: llama.cpp's converter default, f16.
  const GgufOutType& out = *find_gguf_out_type(p.quant == "none" ? "f16" : p.quant);
  LoadedModel loaded = load_model(p.input);
  const HfConfig& config = *loaded.hf_config;
  const std::string arch = gguf_architecture(config);
  const HfDecoderFacts facts = read_hf_decoder_facts(p.input);
  const HfTokenizer tokenizer = read_hf_tokenizer(p.input, config.vocab_size);
  if (!tokenizer.pre_reason.empty()) {
    spdlog::warn("tokenizer.ggml.pre is 'default': {} (llama.cpp will warn that generation "
                 "quality may be degraded)",
                 tokenizer.pre_reason);
  }
  const std::vector<GgufTensorPlan> plan = plan_llama_gguf(loaded.graph, config, out);

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
    const uint64_t row_bytes = gguf_row_bytes(t.type, static_cast<uint64_t>(cols));
    SourceRows source(src, cols, t.permute_heads);
    for (int64_t r = 0; r < rows; ++r) {
      gguf_quantize_row(t.type, source.row(r), dst.subspan(r * row_bytes, row_bytes));
    }
    bytes_in += src.nbytes();
    bytes_out += dst.size();
    table.push_back({{"name", t.name},
                    {"source", t.source},
                    {"shape", t.shape},
                    {"dtype", std::string(dtype_name(src.dtype()))},
                    {"type", std::string(gguf::tensor_type_info(t.type).name)},
                    {"bytes", dst.size()}});
  });
  report.stats["architecture"] = arch;
  report.stats["type"] = std::string(out.name);
  report.stats["tensors_written"] = plan.size();
  report.stats["metadata_keys"] = writer.kv_count();
  report.stats["tokenizer_pre"] = tokenizer.pre;
  report.stats["gguf_tensors"] = std::move(table);
  ConvertResult result;
  result.weights_bytes_in = bytes_in;
  result.weights_bytes_out = bytes_out;
  result.report.passes.push_back(std::move(report));
  return result;
}

}  // namespace qforge::cli
