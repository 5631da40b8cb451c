#include "exporters/trtllm/trtllm_ckpt_writer.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <regex>

#include "exporters/atomic_folder.h"
#include "exporters/hf_folder/hf_folder_writer.h"
#include "exporters/quant_checkpoint/hf_quant_writer.h"
#include "exporters/safetensors/safetensors_stream_writer.h"
#include "ir/error.h"

namespace qforge {

namespace {

namespace fs = std::filesystem;

// TensorRT-LLM's group-wise int4 GEMM (WeightOnlyGroupwiseQuantMatmul) runs these group sizes.
constexpr int64_t kGroupSizes[] = {64, 128};

// The architectures TensorRT-LLM builds with its Llama model (LLaMAForCausalLM).
constexpr std::string_view kArchitectures[] = {"LlamaForCausalLM", "MistralForCausalLM"};

bool is_quantized_linear(const QuantRecord& r) {
  return r.kind == QuantKind::Weight && r.reader.empty() && r.packing == QuantPacking::Onnx &&
         (r.dtype == DType::I4 || r.dtype == DType::I8);
}

std::string trtllm_dtype(DType d) {
  switch (d) {
    case DType::F16: return "float16";
    case DType::BF16: return "bfloat16";
    case DType::F32: return "float32";
    default: fail_unsupported("trtllm-ckpt holds float16, bfloat16 or float32 weights, not " +
                              std::string(dtype_name(d)));
  }
}

int64_t json_int(const nlohmann::ordered_json& config, const char* key, const fs::path& path) {
  if (!config.contains(key) || !config[key].is_number_integer()) {
    std::string message(1, '\'');
    message.append(path.string()).append("' has no integer '").append(key);
    message.append("': trtllm-ckpt's config.json needs it");
    fail_invalid(message);
  }
  return config[key].get<int64_t>();
}

// Rows [r0, r1) and columns [c0, c1) of a float [N, K] tensor (or rows of a [N] one), copied.
Tensor slice2d(const Tensor& t, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
  const int64_t cols = t.rank() == 2 ? t.shape()[1] : 1;
  if (r0 == 0 && r1 == t.shape()[0] && c0 == 0 && c1 == cols) return t;
  const size_t esize = static_cast<size_t>(dtype_bits(t.dtype()) / 8);
  Shape shape = t.rank() == 2 ? Shape{r1 - r0, c1 - c0} : Shape{r1 - r0};
  Tensor out(t.dtype(), std::move(shape));
  const auto in = t.bytes();
  auto dst = out.mutable_bytes();
  const size_t row_bytes = static_cast<size_t>(c1 - c0) * esize;
  for (int64_t r = r0; r < r1; ++r) {
    std::memcpy(dst.data() + static_cast<size_t>(r - r0) * row_bytes,
                in.data() + (static_cast<size_t>(r) * static_cast<size_t>(cols) +
                             static_cast<size_t>(c0)) * esize,
                row_bytes);
  }
  return out;
}

// Tensors of the same dtype and columns, one after another along the rows.
Tensor concat_rows(const std::vector<Tensor>& parts) {
  if (parts.size() == 1) return parts[0];
  int64_t rows = 0;
  for (const Tensor& p : parts) rows += p.shape()[0];
  Shape shape = parts[0].shape();
  shape[0] = rows;
  Tensor out(parts[0].dtype(), std::move(shape));
  auto dst = out.mutable_bytes();
  size_t at = 0;
  for (const Tensor& p : parts) {
    std::memcpy(dst.data() + at, p.bytes().data(), p.nbytes());
    at += p.nbytes();
  }
  return out;
}

// The signed integer at (r, c) of an i4 (ONNX packing, low nibble first) or i8 [N, k] tensor.
int8_t int_at(std::span<const uint8_t> in, DType dtype, int64_t k, int64_t r, int64_t c) {
  const int64_t e = r * k + c;
  if (dtype == DType::I8) return static_cast<int8_t>(in[static_cast<size_t>(e)]);
  const int nib = (in[static_cast<size_t>(e / 2)] >> (4 * (e % 2))) & 0x0f;
  return static_cast<int8_t>(nib >= 8 ? nib - 16 : nib);
}

// Rows [r0, r1) and columns [c0, c1) of int4 `values` packed two adjacent rows per byte (low
// nibble the even row) into rows [at, at + (r1 - r0) / 2) of `out` (int8 [*, c1 - c0]).
void pack_adjacent_rows_into(Tensor& out, int64_t at, const Tensor& values, int64_t r0,
                             int64_t r1, int64_t c0, int64_t c1) {
  if ((r1 - r0) % 2 != 0) {
    fail_internal("pack_int4_adjacent_rows: " + std::to_string(r1 - r0) + " rows is odd");
  }
  const auto in = values.data<uint8_t>();
  const int64_t k = values.shape()[1], cols = c1 - c0;
  auto dst = out.mutable_data<uint8_t>();
  if (values.dtype() == DType::I4 && k % 2 == 0 && c0 % 2 == 0 && cols % 2 == 0) {
    // Whole bytes: byte b of an input row holds columns 2b (low) and 2b + 1 (high), so each
    // pair of rows' bytes e (even row) and o (odd row) make two output bytes.
    for (int64_t i = 0; i < (r1 - r0) / 2; ++i) {
      uint8_t* row = dst.data() + static_cast<size_t>((at + i) * cols);
      const uint8_t* even = in.data() + static_cast<size_t>((r0 + 2 * i) * k + c0) / 2;
      const uint8_t* odd = even + k / 2;
      for (int64_t b = 0; b < cols / 2; ++b) {
        row[2 * b] = static_cast<uint8_t>((even[b] & 0x0f) | ((odd[b] & 0x0f) << 4));
        row[2 * b + 1] = static_cast<uint8_t>((even[b] >> 4) | (odd[b] & 0xf0));
      }
    }
    return;
  }
  for (int64_t i = 0; i < (r1 - r0) / 2; ++i) {
    uint8_t* row = dst.data() + static_cast<size_t>((at + i) * cols);
    for (int64_t c = c0; c < c1; ++c) {
      const auto lo = static_cast<uint8_t>(int_at(in, values.dtype(), k, r0 + 2 * i, c));
      const auto hi = static_cast<uint8_t>(int_at(in, values.dtype(), k, r0 + 2 * i + 1, c));
      row[c - c0] = static_cast<uint8_t>((lo & 0x0f) | (hi << 4));
    }
  }
}

// HF name -> (TensorRT-LLM name, what it is) for the tensors a Llama checkpoint holds.
enum class Kind { Replicated, QkvPart, ColumnLinear, RowLinear, Embedding, LmHead, Skip };

struct Mapped {
  Kind kind = Kind::Skip;
  std::string name;  // TensorRT-LLM module ("transformer.layers.0.mlp.fc") or tensor name
  int64_t layer = -1;
  char qkv = 0;
};

std::optional<Mapped> map_name(const std::string& hf) {
  static const std::regex layer(R"(model\.layers\.(\d+)\.(.+))");
  if (hf == "model.embed_tokens.weight") {
    return Mapped{Kind::Embedding, "transformer.vocab_embedding.weight", -1, 0};
  }
  if (hf == "model.norm.weight") return Mapped{Kind::Replicated, "transformer.ln_f.weight", -1, 0};
  if (hf == "lm_head.weight") return Mapped{Kind::LmHead, "lm_head.weight", -1, 0};
  std::smatch m;
  if (!std::regex_match(hf, m, layer)) return std::nullopt;
  const int64_t n = std::stoll(m[1].str());
  const std::string prefix = "transformer.layers." + m[1].str() + ".";
  const std::string rest = m[2].str();
  if (rest == "input_layernorm.weight") {
    return Mapped{Kind::Replicated, prefix + "input_layernorm.weight", n, 0};
  }
  if (rest == "post_attention_layernorm.weight") {
    return Mapped{Kind::Replicated, prefix + "post_layernorm.weight", n, 0};
  }
  for (const char part : {'q', 'k', 'v'}) {
    if (rest == std::string("self_attn.") + part + "_proj.weight") {
      return Mapped{Kind::QkvPart, prefix + "attention.qkv", n, part};
    }
  }
  if (rest == "self_attn.o_proj.weight") {
    return Mapped{Kind::RowLinear, prefix + "attention.dense", n, 0};
  }
  // TensorRT-LLM's gated MLP: fc is the gate (HF gate_proj), gate the up projection.
  if (rest == "mlp.gate_proj.weight") return Mapped{Kind::ColumnLinear, prefix + "mlp.fc", n, 0};
  if (rest == "mlp.up_proj.weight") return Mapped{Kind::ColumnLinear, prefix + "mlp.gate", n, 0};
  if (rest == "mlp.down_proj.weight") return Mapped{Kind::RowLinear, prefix + "mlp.proj", n, 0};
  if (rest == "self_attn.rotary_emb.inv_freq") return Mapped{Kind::Skip, "", n, 0};
  return std::nullopt;
}

// The source folder's config.json, checked for what the checkpoint needs before anything is
// quantized or written.
struct SourceModel {
  nlohmann::ordered_json config;
  std::string architecture;
  int64_t heads = 0, kv_heads = 0, head_size = 0, intermediate = 0;
  bool tied = false;
};

SourceModel read_source_model(const QuantCheckpointOptions& options) {
  const int tp = options.tensor_parallel;
  if (!options.folder) {
    fail_usage("--format trtllm-ckpt writes a folder (config.json and rank{N}.safetensors): "
               "give -o OUT/");
  }
  if (tp < 1) fail_usage("--tp " + std::to_string(tp) + ": give 1 or more ranks");
  const fs::path config_path = options.source_dir / "config.json";
  SourceModel m;
  if (options.config) {
    m.config = *options.config;
  } else if (options.source_dir.empty() || !fs::exists(config_path)) {
    fail_usage("--format trtllm-ckpt needs the Hugging Face model folder's config.json (the "
               "architecture, heads and sizes): give the model folder as IN");
  } else {
    m.config = read_json_object(config_path);
  }
  const auto& c = m.config;
  if (c.contains("architectures") && c["architectures"].is_array() &&
      !c["architectures"].empty() && c["architectures"][0].is_string()) {
    m.architecture = c["architectures"][0].get<std::string>();
  }
  if (std::find(std::begin(kArchitectures), std::end(kArchitectures), m.architecture) ==
      std::end(kArchitectures)) {
    fail_unsupported("--format trtllm-ckpt writes TensorRT-LLM's Llama checkpoint "
                     "(LlamaForCausalLM, MistralForCausalLM); '" + config_path.string() +
                     "' is " + (m.architecture.empty() ? "of no architecture" : m.architecture) +
                     ": use --format compressed-tensors");
  }
  const int64_t hidden = json_int(c, "hidden_size", config_path);
  m.heads = json_int(c, "num_attention_heads", config_path);
  m.kv_heads = c.contains("num_key_value_heads") && c["num_key_value_heads"].is_number_integer()
                   ? c["num_key_value_heads"].get<int64_t>()
                   : m.heads;
  if (hidden <= 0 || m.heads <= 0 || m.kv_heads <= 0 || m.heads % m.kv_heads != 0) {
    fail_invalid("'" + config_path.string() + "': hidden_size " + std::to_string(hidden) +
                 ", " + std::to_string(m.heads) + " heads and " + std::to_string(m.kv_heads) +
                 " key/value heads do not describe an attention layer");
  }
  m.head_size = c.contains("head_dim") && c["head_dim"].is_number_integer()
                    ? c["head_dim"].get<int64_t>()
                    : hidden / m.heads;
  m.tied = c.contains("tie_word_embeddings") && c["tie_word_embeddings"].is_boolean() &&
           c["tie_word_embeddings"].get<bool>();
  if (m.heads % tp != 0 || m.kv_heads % tp != 0) {
    fail_usage("--tp " + std::to_string(tp) + " does not divide the " +
               std::to_string(m.heads) + " attention heads and " + std::to_string(m.kv_heads) +
               " key/value heads of '" + config_path.string() +
               "' (TensorRT-LLM splits the fused qkv by heads; qforge does not duplicate "
               "key/value heads): give a --tp that divides both");
  }
  const int64_t intermediate = json_int(c, "intermediate_size", config_path);
  m.intermediate = intermediate;
  if (hidden % tp != 0 || intermediate % tp != 0) {
    fail_usage("--tp " + std::to_string(tp) + " does not divide hidden_size " +
               std::to_string(hidden) + " and intermediate_size " + std::to_string(intermediate));
  }
  return m;
}

// Refuses a scheme the layout cannot hold; `what` names the weight or the flags.
void check_scheme(int bits, int64_t block_size, const std::string& what) {
  if (bits != 4 || block_size <= 0) {
    fail_unsupported(
        "trtllm-ckpt: " + what + " is int" + std::to_string(bits) +
        (block_size > 0 ? " block " + std::to_string(block_size) : " per channel") +
        "; TensorRT-LLM's W8A16/W4A16 (per-channel) checkpoints hold int8 weights already "
        "interleaved for one GPU architecture's mixed GEMM (preprocess_weights_for_mixed_gemm, "
        "SM-specific) or float weights the engine build requantizes, so qforge's integers "
        "cannot be written portably: use --quant w4a16 (group-wise, written as W4A16_AWQ, "
        "which trtllm-build preprocesses itself) or --format compressed-tensors");
  }
  if (std::find(std::begin(kGroupSizes), std::end(kGroupSizes), block_size) ==
      std::end(kGroupSizes)) {
    fail_unsupported("trtllm-ckpt: " + what + " has group size " + std::to_string(block_size) +
                     "; TensorRT-LLM's group-wise int4 GEMM takes 64 or 128: give "
                     "--block-size 64 or 128");
  }
}

}  // namespace

void check_trtllm_ckpt(const QuantCheckpointOptions& options, int bits, int64_t block_size) {
  const SourceModel m = read_source_model(options);
  check_scheme(bits, block_size, "--quant " + std::string(bits == 4 ? "w4a16" : "int8-weights"));
  const int tp = options.tensor_parallel;
  const std::pair<const char*, int64_t> row_parallel[] = {
      {"o_proj (attention.dense)", m.heads * m.head_size},
      {"down_proj (mlp.proj)", m.intermediate}};
  for (const auto& [module, k] : row_parallel) {
    if (tp > 1 && (k / tp) % block_size != 0) {
      fail_unsupported("--tp " + std::to_string(tp) + " splits " + module + " (" +
                       std::to_string(k) + " input features, a row-parallel Linear) into " +
                       std::to_string(k / tp) + " per rank, not whole groups of " +
                       std::to_string(block_size) +
                       ": give a --tp or --block-size that divides it");
    }
  }
}

Tensor pack_int4_adjacent_rows(const Tensor& values) {
  if (values.dtype() != DType::I4 || values.rank() != 2) {
    fail_internal("pack_int4_adjacent_rows: " + std::string(dtype_name(values.dtype())) + " " +
                  shape_to_string(values.shape()) + " is not i4 [N, K]");
  }
  if (values.shape()[0] % 2 != 0) {
    fail_internal("pack_int4_adjacent_rows: " + std::to_string(values.shape()[0]) +
                  " rows is odd");
  }
  Tensor out(DType::I8, {values.shape()[0] / 2, values.shape()[1]});
  pack_adjacent_rows_into(out, 0, values, 0, values.shape()[0], 0, values.shape()[1]);
  return out;
}

TrtllmCkptWriter::TrtllmCkptWriter(const fs::path& out, QuantCheckpointOptions options)
    : options_(std::move(options)), tp_(options_.tensor_parallel) {
  SourceModel m = read_source_model(options_);
  source_config_ = std::move(m.config);
  architecture_ = std::move(m.architecture);
  heads_ = m.heads;
  kv_heads_ = m.kv_heads;
  head_size_ = m.head_size;
  tied_ = m.tied;
  bool exists = false;
  out_ = check_hf_folder_target(out, options_.overwrite, exists);
  folder_ = std::make_unique<AtomicFolder>(out_, exists, "folder");
  const std::map<std::string, std::string> metadata{{"format", "pt"}};
  for (int r = 0; r < tp_; ++r) {
    ranks_.push_back(std::make_unique<SafetensorsStreamWriter>(
        folder_->temp_path() / ("rank" + std::to_string(r) + ".safetensors"), 0, metadata,
        options_.header_reserve));
  }
}

TrtllmCkptWriter::~TrtllmCkptWriter() = default;

uint64_t TrtllmCkptWriter::bytes_written() const {
  uint64_t total = 0;
  for (const auto& r : ranks_) total += r->data_bytes();
  return total;
}

void TrtllmCkptWriter::note_float_dtype(const Tensor& tensor) {
  if (!dtype_) dtype_ = tensor.dtype();
}

void TrtllmCkptWriter::write_all(const std::string& name, const Tensor& tensor) {
  for (auto& r : ranks_) r->add(name, tensor);
}

void TrtllmCkptWriter::add(const Graph& part) {
  std::map<std::string, Linear> linears;  // weight initializer -> its quantized form
  std::map<std::string, bool> scales;
  for (const QuantRecord& r : part.quant_records()) {
    if (!is_quantized_linear(r)) {
      fail_unsupported("trtllm-ckpt holds weights-only quantized Linears; '" + r.name +
                       "' is quantized for a graph node (" +
                       std::string(quant_packing_name(r.packing)) + "): write .onnx instead");
    }
    const Tensor* scale = part.find_initializer(r.scale);
    const Tensor* values = part.find_initializer(r.name);
    if (scale == nullptr || values == nullptr) {
      fail_internal("quantized Linear '" + r.name + "' has no values or scale '" + r.scale + "'");
    }
    check_scheme(r.bits, r.block_size, "'" + r.source + "'");
    const std::pair<int, int64_t> scheme{r.bits, r.block_size};
    if (scheme_ && *scheme_ != scheme) {
      fail_unsupported("trtllm-ckpt holds one quantization for every Linear (its config has one "
                       "group_size): '" + r.source + "' differs from the Linears before it");
    }
    scheme_ = scheme;
    linears[r.name] = Linear{r.source, *values, *scale, true, r.bits, r.block_size};
    scales[r.scale] = true;
  }
  for (const auto& [name, tensor] : part.initializers()) {
    if (scales.count(name) != 0) continue;
    const auto q = linears.find(name);
    add_tensor(q != linears.end() ? q->second.source : name, tensor,
               q != linears.end() ? &q->second : nullptr);
  }
}

void TrtllmCkptWriter::add_tensor(const std::string& name, const Tensor& tensor,
                                  const Linear* linear) {
  const std::optional<Mapped> m = map_name(name);
  if (!m) {
    fail_unsupported("trtllm-ckpt: '" + name + "' has no place in TensorRT-LLM's Llama "
                     "checkpoint (" + architecture_ + " without biases): use --format "
                     "compressed-tensors");
  }
  const bool is_linear = m->kind == Kind::QkvPart || m->kind == Kind::ColumnLinear ||
                         m->kind == Kind::RowLinear;
  if (linear != nullptr && !is_linear) {
    fail_unsupported("trtllm-ckpt writes '" + name + "' float (TensorRT-LLM's Llama keeps the "
                     "embedding and lm_head unquantized in W4A16_AWQ); it arrived quantized");
  }
  if (linear == nullptr && tensor.dtype() != DType::F16 && tensor.dtype() != DType::BF16 &&
      tensor.dtype() != DType::F32) {
    fail_unsupported("trtllm-ckpt: '" + name + "' is " + std::string(dtype_name(tensor.dtype())) +
                     "; TensorRT-LLM's checkpoint holds float16, bfloat16 or float32");
  }
  if (is_linear && tensor.rank() != 2) {
    fail_invalid("trtllm-ckpt: '" + name + "' is " + shape_to_string(tensor.shape()) +
                 ", not a Linear weight [out, in]");
  }
  switch (m->kind) {
    case Kind::Skip:
      return;
    case Kind::Replicated:
      note_float_dtype(tensor);
      write_all(m->name, tensor);
      return;
    case Kind::Embedding:
      note_float_dtype(tensor);
      write_all(m->name, tensor);
      // A tied model's lm_head is the embedding: TensorRT-LLM's converter writes it out.
      if (tied_) write_lm_head(tensor, name);
      return;
    case Kind::LmHead:
      if (tied_) return;  // written from the embedding
      write_lm_head(tensor, name);
      return;
    case Kind::QkvPart: {
      Linear part = linear != nullptr ? *linear : Linear{name, tensor, Tensor(), false, 0, 0};
      const int64_t rows = (m->qkv == 'q' ? heads_ : kv_heads_) * head_size_;
      if (tensor.shape()[0] != rows) {
        fail_invalid("trtllm-ckpt: '" + name + "' has " + std::to_string(tensor.shape()[0]) +
                     " output features; config.json's heads and head size say " +
                     std::to_string(rows) + " (the fused qkv is split by heads)");
      }
      auto& layer = pending_qkv_[m->layer];
      if (layer.count(m->qkv) != 0) fail_invalid("trtllm-ckpt: '" + name + "' arrived twice");
      layer.emplace(m->qkv, std::move(part));
      if (layer.size() < 3) return;
      const std::vector<const Linear*> parts = {&layer.at('q'), &layer.at('k'), &layer.at('v')};
      write_linear(m->name, parts, false);
      pending_qkv_.erase(m->layer);
      return;
    }
    case Kind::ColumnLinear:
    case Kind::RowLinear: {
      const Linear part = linear != nullptr ? *linear : Linear{name, tensor, Tensor(), false, 0, 0};
      write_linear(m->name, {&part}, m->kind == Kind::RowLinear);
      return;
    }
  }
}

void TrtllmCkptWriter::write_lm_head(const Tensor& weight, const std::string& from) {
  if (weight.rank() != 2) {
    fail_invalid("trtllm-ckpt: '" + from + "' is " + shape_to_string(weight.shape()) +
                 ", not [vocab, hidden]");
  }
  note_float_dtype(weight);
  const int64_t vocab = weight.shape()[0], hidden = weight.shape()[1];
  // pad_vocab_size: the vocabulary zero-padded to a multiple of tp, then split along it.
  const int64_t padded = (vocab + tp_ - 1) / tp_ * tp_;
  const int64_t rows = padded / tp_;
  for (int r = 0; r < tp_; ++r) {
    const int64_t r0 = r * rows, r1 = std::min(vocab, r0 + rows);
    Tensor shard = slice2d(weight, r0, r1, 0, hidden);
    if (r1 - r0 < rows) {
      Tensor full(weight.dtype(), {rows, hidden});  // zero rows after the vocabulary
      std::memcpy(full.mutable_bytes().data(), shard.bytes().data(), shard.nbytes());
      shard = std::move(full);
    }
    ranks_[static_cast<size_t>(r)]->add("lm_head.weight", shard);
  }
  lm_head_written_ = true;
}

void TrtllmCkptWriter::write_linear(const std::string& module,
                                    const std::vector<const Linear*>& parts, bool row_parallel) {
  const bool quantized = parts[0]->quantized;
  for (const Linear* p : parts) {
    if (p->quantized != quantized) {
      fail_unsupported("trtllm-ckpt fuses q, k and v into '" + module + "': '" +
                       parts[0]->source + "' and '" + p->source + "' differ (one quantized, one "
                       "float); an engine takes one scheme per fused layer");
    }
    if (p->weight.shape()[1] != parts[0]->weight.shape()[1]) {
      fail_invalid("trtllm-ckpt: '" + p->source + "' has " +
                   std::to_string(p->weight.shape()[1]) + " input features, '" +
                   parts[0]->source + "' " + std::to_string(parts[0]->weight.shape()[1]));
    }
  }
  if (!quantized) {
    note_float_dtype(parts[0]->weight);
    exclude_.push_back(module);
  } else {
    ++quantized_;
  }
  const int64_t k = parts[0]->weight.shape()[1];
  const int64_t block = parts[0]->block;
  if (row_parallel) {
    if (k % tp_ != 0) {
      fail_unsupported("--tp " + std::to_string(tp_) + " does not divide the " +
                       std::to_string(k) + " input features of '" + parts[0]->source + "'");
    }
    if (quantized && parts[0]->weight.shape()[0] % 2 != 0) {
      fail_unsupported("trtllm-ckpt: '" + parts[0]->source + "' has an odd number of output "
                       "features; int4 packs two output rows per byte");
    }
    if (quantized && (k / tp_) % block != 0) {
      fail_unsupported("--tp " + std::to_string(tp_) + " splits '" + parts[0]->source + "' (" +
                       std::to_string(k) + " input features, a row-parallel Linear) into " +
                       std::to_string(k / tp_) + " per rank, not whole groups of " +
                       std::to_string(block) + ": give a --tp or --block-size that divides it");
    }
  } else {
    for (const Linear* p : parts) {
      const int64_t n = p->weight.shape()[0];
      if (n % tp_ != 0 || (quantized && (n / tp_) % 2 != 0)) {
        fail_unsupported("--tp " + std::to_string(tp_) + " splits the " + std::to_string(n) +
                         " output features of '" + p->source + "' into " +
                         (n % tp_ != 0 ? "unequal parts" : "an odd number per rank") +
                         (quantized ? " (int4 packs two output rows per byte)" : "") +
                         ": give a --tp that divides it");
      }
    }
  }
  for (int r = 0; r < tp_; ++r) {
    std::vector<Tensor> weights, scales;
    std::vector<std::array<int64_t, 4>> windows;  // per part: rows [0, 1), columns [2, 3)
    int64_t rows = 0;
    for (const Linear* p : parts) {
      const int64_t n = p->weight.shape()[0];
      const int64_t r0 = row_parallel ? 0 : r * (n / tp_);
      const int64_t r1 = row_parallel ? n : r0 + n / tp_;
      const int64_t c0 = row_parallel ? r * (k / tp_) : 0;
      const int64_t c1 = row_parallel ? c0 + k / tp_ : k;
      windows.push_back({r0, r1, c0, c1});
      rows += r1 - r0;
      if (!quantized) {
        weights.push_back(slice2d(p->weight, r0, r1, c0, c1));
      } else {
        scales.push_back(slice2d(p->scale, r0, r1, c0 / block, c1 / block));
      }
    }
    SafetensorsStreamWriter& out = *ranks_[static_cast<size_t>(r)];
    if (!quantized) {
      out.add(module + ".weight", concat_rows(weights));
      continue;
    }
    const int64_t cols = row_parallel ? k / tp_ : k;
    Tensor packed(DType::I8, {rows / 2, cols});
    int64_t at = 0;
    for (size_t i = 0; i < parts.size(); ++i) {
      const auto& [r0, r1, c0, c1] = windows[i];
      pack_adjacent_rows_into(packed, at, parts[i]->weight, r0, r1, c0, c1);
      at += (r1 - r0) / 2;
    }
    out.add(module + ".weight", packed);
    out.add(module + ".weights_scaling_factor", concat_rows(scales));
  }
}

void TrtllmCkptWriter::finish() {
  if (!pending_qkv_.empty()) {
    const auto& [layer, parts] = *pending_qkv_.begin();
    std::string have;
    for (const auto& entry : parts) {
      if (!have.empty()) have += ", ";
      have.push_back(entry.first);
    }
    fail_invalid("trtllm-ckpt: layer " + std::to_string(layer) + " has only " + have +
                 " of q, k and v: the fused attention.qkv needs all three");
  }
  if (!lm_head_written_) {
    fail_invalid("trtllm-ckpt: the model has no lm_head.weight and config.json does not say "
                 "tie_word_embeddings: TensorRT-LLM's checkpoint needs lm_head.weight");
  }
  for (auto& r : ranks_) r->finish();

  const auto& c = source_config_;
  const fs::path config_path = options_.source_dir / "config.json";
  nlohmann::ordered_json config;
  config["architecture"] = architecture_;
  config["dtype"] = trtllm_dtype(dtype_.value_or(DType::F16));
  config["logits_dtype"] = "float32";
  config["vocab_size"] = json_int(c, "vocab_size", config_path);
  config["hidden_size"] = json_int(c, "hidden_size", config_path);
  config["num_hidden_layers"] = json_int(c, "num_hidden_layers", config_path);
  config["num_attention_heads"] = heads_;
  config["num_key_value_heads"] = kv_heads_;
  config["head_size"] = head_size_;
  config["hidden_act"] = c.value("hidden_act", std::string("silu"));
  config["intermediate_size"] = json_int(c, "intermediate_size", config_path);
  config["max_position_embeddings"] = c.value("max_position_embeddings", int64_t{2048});
  config["norm_epsilon"] = c.value("rms_norm_eps", 1e-5);
  config["position_embedding_type"] = "rope_gpt_neox";
  // transformers 4 writes rope_theta and rope_scaling; transformers 5 rope_parameters.
  const nlohmann::ordered_json rope =
      c.contains("rope_parameters") && c["rope_parameters"].is_object() ? c["rope_parameters"]
                                                                        : nlohmann::ordered_json();
  double base = 10000.0;
  if (c.contains("rope_theta") && c["rope_theta"].is_number()) {
    base = c["rope_theta"].get<double>();
  } else if (rope.contains("rope_theta") && rope["rope_theta"].is_number()) {
    base = rope["rope_theta"].get<double>();
  }
  config["rotary_base"] = base;
  if (c.contains("rope_scaling") && c["rope_scaling"].is_object()) {
    config["rotary_scaling"] = c["rope_scaling"];
  } else if (rope.is_object() && rope.value("rope_type", std::string("default")) != "default") {
    nlohmann::ordered_json scaling = rope;
    scaling.erase("rope_theta");
    config["rotary_scaling"] = scaling;
  } else {
    config["rotary_scaling"] = nullptr;
  }
  config["tie_word_embeddings"] = tied_;
  config["use_parallel_embedding"] = false;
  config["embedding_sharding_dim"] = 0;
  config["mapping"] = {{"world_size", tp_}, {"tp_size", tp_}, {"pp_size", 1}};
  nlohmann::ordered_json quant;
  std::vector<std::string> exclude = {"lm_head"};
  exclude.insert(exclude.end(), exclude_.begin(), exclude_.end());
  if (scheme_) {
    // Group-wise int4 with no pre-quant scale: the one TensorRT-LLM algorithm whose checkpoint
    // holds plain packed integers that trtllm-build lays out for its GPU (see the header).
    quant = {{"quant_algo", "W4A16_AWQ"},
             {"kv_cache_quant_algo", nullptr},
             {"group_size", scheme_->second},
             {"has_zero_point", false},
             {"pre_quant_scale", false},
             {"exclude_modules", exclude}};
  } else {
    quant = {{"quant_algo", nullptr}, {"kv_cache_quant_algo", nullptr}};
  }
  config["quantization"] = std::move(quant);
  write_json(folder_->temp_path() / "config.json", config);
  folder_->commit();
}

}  // namespace qforge
