#include "importers/gguf/gguf_model_reader.h"

#include <cstring>
#include <map>
#include <optional>
#include <set>

#include "ir/error.h"
#include "ir/gguf_decoder_names.h"
#include "ir/half.h"
#include "ir/quantized_linear.h"

namespace qforge::gguf {

namespace {

constexpr int64_t kGroup = 32;

struct Figures {
  int64_t hidden = 0, heads = 0, kv_heads = 0, head_dim = 0, inter = 0, vocab = 0, layers = 0;
};

class Reader {
 public:
  Reader(const GgufFile& g, std::span<const std::byte> bytes, const std::string& path)
      : g_(g), bytes_(bytes), path_(path) {}

  GgufDecoder read();

 private:
  [[noreturn]] void bad(const std::string& what) const {
    fail_invalid("GGUF '" + path_ + "': " + what);
  }

  std::optional<double> number(const std::string& key) const {
    const KeyValue* kv = g_.find(key);
    if (kv == nullptr) return std::nullopt;
    if (!kv->value.is_number()) bad("metadata '" + key + "' is not a number");
    return kv->value.get<double>();
  }

  int64_t count(const std::string& key) const {
    const auto v = number(key);
    if (!v) bad("has no '" + key + "', which a " + arch_ + " model needs");
    if (*v <= 0 || *v > 1e9 || *v != static_cast<double>(static_cast<int64_t>(*v))) {
      bad("metadata '" + key + "' is " + std::to_string(*v) + ", not a positive count");
    }
    return static_cast<int64_t>(*v);
  }

  std::span<const std::byte> data(const TensorEntry& t) const {
    return bytes_.subspan(g_.data_offset + t.offset, t.nbytes);
  }

  // The tensor `gguf_name`, shape checked (outermost first); nullptr when absent and optional.
  const TensorEntry* take(const std::string& gguf_name, const std::vector<int64_t>& shape,
                          bool optional) {
    const TensorEntry* t = g_.find_tensor(gguf_name);
    if (t == nullptr) {
      if (optional) return nullptr;
      bad("has no tensor '" + gguf_name + "', which its " + arch_ + " metadata (" +
          std::to_string(f_.layers) + " blocks) implies");
    }
    std::vector<int64_t> got(t->ne.rbegin(), t->ne.rend());
    if (got != shape) {
      auto text = [](const std::vector<int64_t>& s) {
        std::string r = "[";
        for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
        return r + "]";
      };
      bad("tensor '" + gguf_name + "' has shape " + text(got) + " but the " + arch_ +
          ".* metadata implies " + text(shape) + "; the file is inconsistent (re-export it)");
    }
    used_.insert(gguf_name);
    return t;
  }

  void add(const std::string& hf, const std::string& gguf_name, const std::vector<int64_t>& shape,
           int64_t permute_heads, bool optional, bool layer_linear);

  const GgufFile& g_;
  std::span<const std::byte> bytes_;
  std::string path_;
  std::string arch_;
  Figures f_;
  std::set<std::string> used_;
  GgufDecoder out_;
};

// Row r of the Hugging Face weight is row permuted_row(r) of the GGUF one (convert_hf_to_gguf's
// permute(): W.reshape(heads, 2, rows/heads/2, cols).swapaxes(1, 2)).
int64_t permuted_row(int64_t r, int64_t rows, int64_t heads) {
  if (heads <= 0) return r;
  const int64_t per_head = rows / heads;
  const int64_t half = per_head / 2;
  const int64_t h = r / per_head;
  const int64_t within = r % per_head;
  const int64_t s = within / half;
  const int64_t i = within % half;
  return h * per_head + 2 * i + s;
}

uint16_t load_u16(const std::byte* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// One GGUF row (ne[0] elements) as float32, as gguf.quants.dequantize computes it.
void dequantize_row(TensorType type, const std::byte* src, int64_t n, float* dst) {
  switch (type) {
    case TensorType::F32: std::memcpy(dst, src, static_cast<size_t>(n) * 4); return;
    case TensorType::F16:
      for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(load_u16(src + 2 * i));
      return;
    case TensorType::BF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(load_u16(src + 2 * i));
      return;
    case TensorType::Q8_0:
      for (int64_t b = 0; b < n / kGroup; ++b) {
        const std::byte* blk = src + b * 34;
        const float d = f16_to_f32(load_u16(blk));
        for (int64_t j = 0; j < kGroup; ++j) {
          dst[b * kGroup + j] = d * static_cast<float>(static_cast<int8_t>(blk[2 + j]));
        }
      }
      return;
    case TensorType::Q4_0:
      for (int64_t b = 0; b < n / kGroup; ++b) {
        const std::byte* blk = src + b * 18;
        const float d = f16_to_f32(load_u16(blk));
        for (int64_t j = 0; j < 16; ++j) {
          const auto byte = static_cast<uint8_t>(blk[2 + j]);
          dst[b * kGroup + j] = d * static_cast<float>((byte & 0x0f) - 8);
          dst[b * kGroup + 16 + j] = d * static_cast<float>((byte >> 4) - 8);
        }
      }
      return;
    case TensorType::Q4_1:
      for (int64_t b = 0; b < n / kGroup; ++b) {
        const std::byte* blk = src + b * 20;
        const float d = f16_to_f32(load_u16(blk));
        const float m = f16_to_f32(load_u16(blk + 2));
        for (int64_t j = 0; j < 16; ++j) {
          const auto byte = static_cast<uint8_t>(blk[4 + j]);
          const float lo = d * static_cast<float>(byte & 0x0f);
          const float hi = d * static_cast<float>(byte >> 4);
          dst[b * kGroup + j] = lo + m;
          dst[b * kGroup + 16 + j] = hi + m;
        }
      }
      return;
  }
}

void Reader::add(const std::string& hf, const std::string& gguf_name,
                 const std::vector<int64_t>& shape, int64_t permute_heads, bool optional,
                 bool layer_linear) {
  const TensorEntry* t = take(gguf_name, shape, optional);
  if (t == nullptr) return;
  const int64_t cols = shape.back();
  int64_t nrows = 1;
  for (size_t i = 0; i + 1 < shape.size(); ++i) nrows *= shape[i];
  const TensorTypeInfo& info = tensor_type_info(t->type);
  const int64_t row_bytes = cols / info.block_size * info.type_size;
  const std::span<const std::byte> src = data(*t);
  const bool integer = t->type == TensorType::Q4_0 || t->type == TensorType::Q8_0;
  const std::string module = hf.substr(0, hf.size() - std::string_view(".weight").size());
  if (layer_linear && integer) {
    const bool q4 = t->type == TensorType::Q4_0;
    const int64_t groups = cols / kGroup;
    Tensor values(q4 ? DType::I4 : DType::I8, {nrows, cols});
    Tensor scale(DType::F16, {nrows, groups});
    auto v = values.mutable_data<uint8_t>();
    auto s = scale.mutable_data<uint16_t>();
    for (int64_t r = 0; r < nrows; ++r) {
      const std::byte* row = src.data() + permuted_row(r, nrows, permute_heads) * row_bytes;
      for (int64_t b = 0; b < groups; ++b) {
        const std::byte* blk = row + b * info.type_size;
        s[static_cast<size_t>(r * groups + b)] = load_u16(blk);
        for (int64_t j = 0; j < kGroup; ++j) {
          const int64_t e = r * cols + b * kGroup + j;
          if (q4) {
            const auto byte = static_cast<uint8_t>(blk[2 + j % 16]);
            const int q = (j < 16 ? (byte & 0x0f) : (byte >> 4)) - 8;
            v[static_cast<size_t>(e / 2)] |=
                static_cast<uint8_t>((static_cast<uint32_t>(q) & 0x0f) << (4 * (e % 2)));
          } else {
            v[static_cast<size_t>(e)] = static_cast<uint8_t>(blk[2 + j]);
          }
        }
      }
    }
    store_quantized_linear(out_.graph, hf, std::move(values), std::move(scale), kGroup);
    ++(q4 ? out_.q4_linears : out_.q8_linears);
    return;
  }
  if (layer_linear && t->type == TensorType::Q4_1) {
    out_.unfit.push_back(hf + " (" + gguf_name + ", Q4_1)");
  } else if (layer_linear || hf == "lm_head.weight") {
    out_.float_linears.push_back(module);
  }
  // F16 / BF16 / F32 stay in their dtype; a quantized type becomes float32 (exact).
  const bool keep = t->type == TensorType::F16 || t->type == TensorType::BF16 ||
                    t->type == TensorType::F32;
  const DType dtype = t->type == TensorType::F16    ? DType::F16
                      : t->type == TensorType::BF16 ? DType::BF16
                                                    : DType::F32;
  Tensor tensor(dtype, Shape(shape.begin(), shape.end()));
  auto dst = tensor.mutable_bytes();
  const size_t out_row = static_cast<size_t>(cols) * static_cast<size_t>(dtype_bits(dtype) / 8);
  std::vector<float> row(static_cast<size_t>(cols));
  for (int64_t r = 0; r < nrows; ++r) {
    const std::byte* from = src.data() + permuted_row(r, nrows, permute_heads) * row_bytes;
    std::byte* to = dst.data() + static_cast<size_t>(r) * out_row;
    if (keep) {
      std::memcpy(to, from, out_row);
    } else {
      dequantize_row(t->type, from, cols, row.data());
      std::memcpy(to, row.data(), out_row);
    }
  }
  out_.graph.set_initializer(hf, std::move(tensor));
}

const DecoderFamily& family_of(const std::string& arch, const std::string& path) {
  for (const auto& f : kDecoderFamilies) {
    if (arch == f.arch) return f;
  }
  fail_unsupported("GGUF '" + path + "' is a '" + arch + "' model; qforge reads back llama, "
                   "qwen2 and qwen3 decoders (LlamaForCausalLM, MistralForCausalLM, "
                   "Qwen2ForCausalLM, Qwen3ForCausalLM)");
}

GgufDecoder Reader::read() {
  const KeyValue* a = g_.find("general.architecture");
  if (a == nullptr || !a->value.is_string()) bad("has no general.architecture string");
  arch_ = a->value.get<std::string>();
  const DecoderFamily& family = family_of(arch_, path_);
  out_.arch = arch_;
  const std::string p = arch_ + ".";
  f_.layers = count(p + "block_count");
  f_.hidden = count(p + "embedding_length");
  f_.inter = count(p + "feed_forward_length");
  f_.heads = count(p + "attention.head_count");
  f_.kv_heads = g_.find(p + "attention.head_count_kv") ? count(p + "attention.head_count_kv")
                                                       : f_.heads;
  const bool head_dim_given = g_.find(p + "attention.key_length") != nullptr;
  f_.head_dim = head_dim_given ? count(p + "attention.key_length") : f_.hidden / f_.heads;
  if (!head_dim_given && f_.hidden % f_.heads != 0) {
    bad(p + "embedding_length is not a multiple of " + p + "attention.head_count");
  }
  if (f_.layers > 100000 || f_.heads % f_.kv_heads != 0 || f_.head_dim % 2 != 0) {
    bad("the " + p + "* metadata is inconsistent (block_count " + std::to_string(f_.layers) +
        ", head_count " + std::to_string(f_.heads) + ", head_count_kv " +
        std::to_string(f_.kv_heads) + ", head size " + std::to_string(f_.head_dim) + ")");
  }
  const TensorEntry* embd = g_.find_tensor("token_embd.weight");
  if (embd == nullptr || embd->ne.size() != 2) bad("has no 2-D tensor 'token_embd.weight'");
  f_.vocab = static_cast<int64_t>(embd->ne[1]);
  if (const auto v = number(p + "vocab_size"); v && *v != static_cast<double>(f_.vocab)) {
    bad("tensor 'token_embd.weight' has " + std::to_string(f_.vocab) + " rows but " + p +
        "vocab_size is " + std::to_string(static_cast<int64_t>(*v)));
  }
  auto dim = [&](DecoderDim d) -> int64_t {
    switch (d) {
      case DecoderDim::Hidden: return f_.hidden;
      case DecoderDim::QOut: return f_.heads * f_.head_dim;
      case DecoderDim::KvOut: return f_.kv_heads * f_.head_dim;
      case DecoderDim::Inter: return f_.inter;
      case DecoderDim::Vocab: return f_.vocab;
      case DecoderDim::HeadDim: return f_.head_dim;
    }
    return 0;
  };
  const bool tied = g_.find_tensor("output.weight") == nullptr;
  add("model.embed_tokens.weight", "token_embd.weight", {f_.vocab, f_.hidden}, 0, false, false);
  for (int64_t i = 0; i < f_.layers; ++i) {
    const std::string hf = "model.layers." + std::to_string(i) + ".";
    const std::string blk = "blk." + std::to_string(i) + ".";
    for (const auto& lt : decoder_layer_tensors()) {
      if (lt.qk_norm && !family.qk_norm) continue;
      std::vector<int64_t> shape;
      for (DecoderDim d : lt.shape) shape.push_back(dim(d));
      int64_t heads = lt.rope == 'q' ? f_.heads : lt.rope == 'k' ? f_.kv_heads : 0;
      if (!family.permute_qk) heads = 0;
      const bool bias = std::string_view(lt.hf).ends_with(".bias");
      add(hf + lt.hf, blk + lt.gguf, shape, heads, bias, shape.size() == 2);
    }
  }
  add("model.norm.weight", "output_norm.weight", {f_.hidden}, 0, false, false);
  if (!tied) add("lm_head.weight", "output.weight", {f_.vocab, f_.hidden}, 0, false, false);
  if (tied) out_.float_linears.emplace_back("lm_head");
  for (const auto& t : g_.tensors) {
    // llama.cpp's converter may add rope_freqs for scaled RoPE, which qforge does not map.
    if (used_.count(t.name) == 0) {
      bad("tensor '" + t.name + "' has no Hugging Face counterpart in a " +
          std::to_string(f_.layers) + "-block " + arch_ + " model (a variant qforge does not "
          "map, or the file is inconsistent)");
    }
  }

  bool any_f16 = false, any_bf16 = false;
  for (const auto& t : g_.tensors) {
    any_f16 |= t.type == TensorType::F16 || t.type == TensorType::Q4_0 ||
               t.type == TensorType::Q8_0 || t.type == TensorType::Q4_1;
    any_bf16 |= t.type == TensorType::BF16;
  }
  nlohmann::ordered_json& c = out_.config;
  c["architectures"] = nlohmann::ordered_json::array({family.hf_architecture});
  c["model_type"] = family.model_type;
  c["hidden_size"] = f_.hidden;
  c["intermediate_size"] = f_.inter;
  c["num_hidden_layers"] = f_.layers;
  c["num_attention_heads"] = f_.heads;
  c["num_key_value_heads"] = f_.kv_heads;
  if (head_dim_given || family.qk_norm) c["head_dim"] = f_.head_dim;
  if (const auto eps = number(p + "attention.layer_norm_rms_epsilon")) {
    c["rms_norm_eps"] = static_cast<double>(static_cast<float>(*eps));
  } else {
    bad("has no '" + p + "attention.layer_norm_rms_epsilon'");
  }
  if (const auto theta = number(p + "rope.freq_base")) c["rope_theta"] = *theta;
  if (g_.find(p + "context_length")) c["max_position_embeddings"] = count(p + "context_length");
  c["vocab_size"] = f_.vocab;
  c["tie_word_embeddings"] = tied;
  c["hidden_act"] = "silu";
  c["torch_dtype"] = any_bf16 && !any_f16 ? "bfloat16" : any_f16 ? "float16" : "float32";
  for (const char* key : {"bos_token_id", "eos_token_id"}) {
    const std::string k = std::string("tokenizer.ggml.") +
                          (key[0] == 'b' ? "bos_token_id" : "eos_token_id");
    if (const auto v = number(k)) c[key] = static_cast<int64_t>(*v);
  }
  return std::move(out_);
}

}  // namespace

GgufDecoder read_gguf_decoder(const GgufFile& file, std::span<const std::byte> bytes,
                              const std::string& path) {
  return Reader(file, bytes, path).read();
}

GgufDecoder read_gguf_decoder(const std::filesystem::path& path) {
  const GgufModel m = read_gguf(path);
  return read_gguf_decoder(m.file, m.map->bytes(), path.string());
}

}  // namespace qforge::gguf
