#include "cli/gguf_llama_map.h"

#include <map>
#include <optional>
#include <regex>

#include <spdlog/spdlog.h>

#include "ir/error.h"

namespace qforge::cli {

namespace {

using Dim = gguf::DecoderDim;

struct Figures {
  int64_t hidden, heads, kv_heads, head_dim, inter, vocab, layers;
};

int64_t required(const std::optional<int64_t>& v, const char* key) {
  if (!v || *v <= 0) {
    fail_invalid(std::string("config.json has no positive \"") + key +
                 "\"; GGUF export needs it for the llama.* metadata");
  }
  return *v;
}

Figures figures(const HfConfig& c) {
  Figures f{};
  f.hidden = required(c.hidden_size, "hidden_size");
  f.heads = required(c.num_attention_heads, "num_attention_heads");
  f.kv_heads = required(c.num_key_value_heads, "num_key_value_heads");
  f.head_dim = required(c.head_dim, "head_dim");
  f.inter = required(c.intermediate_size, "intermediate_size");
  f.vocab = required(c.vocab_size, "vocab_size");
  f.layers = required(c.num_hidden_layers, "num_hidden_layers");
  return f;
}

int64_t dim_value(Dim d, const Figures& f) {
  switch (d) {
    case Dim::Hidden: return f.hidden;
    case Dim::QOut: return f.heads * f.head_dim;
    case Dim::KvOut: return f.kv_heads * f.head_dim;
    case Dim::Inter: return f.inter;
    case Dim::Vocab: return f.vocab;
    case Dim::HeadDim: return f.head_dim;
  }
  return 0;
}

std::string shape_text(const std::vector<int64_t>& s) {
  std::string t = "[";
  for (size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + "]";
}

// The type rules of convert_hf_to_gguf.py (1-D tensors and norms stay F32; a row that is not
// a whole number of blocks falls back to F16) and of llama-quantize for Q4_0/Q4_1 (the output
// projection one step up; llama-quantize picks Q6_K when the row is a multiple of 256 and
// Q8_0 otherwise, and qforge writes Q8_0, which it makes bit-exact with ggml).
gguf::TensorType type_for(const std::string& name, const std::vector<int64_t>& shape,
                          const GgufOutType& out, bool is_output) {
  if (shape.size() <= 1 || name.ends_with("_norm.weight")) return gguf::TensorType::F32;
  gguf::TensorType t = is_output ? out.output_type : out.type;
  const auto& info = gguf::tensor_type_info(t);
  if (static_cast<uint64_t>(shape.back()) % info.block_size != 0) {
    spdlog::warn("{}: rows of {} elements are not whole {} blocks; written as F16 (as "
                 "llama.cpp's converter falls back)",
                 name, shape.back(), info.name);
    t = gguf::TensorType::F16;
  }
  return t;
}

}  // namespace

const GgufOutType* find_gguf_out_type(std::string_view name) {
  for (const auto& t : kGgufOutTypes) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

std::string gguf_out_types_help() {
  std::string s;
  for (const auto& t : kGgufOutTypes) {
    if (!s.empty()) s += '\n';
    s.append("  ").append(t.name).append(" (--format gguf): ").append(t.description);
  }
  return s;
}

const GgufFamily& gguf_family(const HfConfig& config) {
  for (const auto& a : config.architectures) {
    for (const auto& f : gguf::kDecoderFamilies) {
      if (a == f.hf_architecture) return f;
    }
  }
  std::string names;
  for (const auto& a : config.architectures) {
    if (!names.empty()) names += ", ";
    names += a;
  }
  if (names.empty()) names = "model_type '" + config.model_type + "'";
  fail_unsupported("GGUF export handles LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM "
                   "and Qwen3ForCausalLM; this model is " + names + " (Phi-3 and others are "
                   "not mapped yet)");
}

std::string gguf_architecture(const HfConfig& config) { return gguf_family(config).arch; }

std::vector<GgufTensorPlan> plan_llama_gguf(const Graph& weights, const HfConfig& config,
                                            const GgufOutType& out) {
  const Figures f = figures(config);
  const GgufFamily& family = gguf_family(config);
  if (f.heads % f.kv_heads != 0) {
    fail_invalid("config.json: num_attention_heads " + std::to_string(f.heads) +
                 " is not a multiple of num_key_value_heads " + std::to_string(f.kv_heads));
  }
  if (f.head_dim % 2 != 0) {
    fail_invalid("config.json: head_dim " + std::to_string(f.head_dim) + " is odd; RoPE pairs "
                 "need an even head size");
  }
  const bool has_output = weights.has_initializer("lm_head.weight");
  std::vector<GgufTensorPlan> plan;
  std::map<std::string, bool> used;
  for (const auto& [name, t] : weights.initializers()) used[name] = false;
  auto add = [&](const std::string& source, const std::string& gguf_name,
                 const std::vector<int64_t>& expected, int64_t permute_heads, bool optional,
                 bool is_output) {
    const Tensor* t = weights.find_initializer(source);
    if (t == nullptr) {
      if (optional) return;
      fail_invalid("the checkpoint has no '" + source + "', which a " +
                   std::to_string(f.layers) + "-layer " + family.hf_architecture +
                   " (config.json) needs");
    }
    if (t->shape() != expected) {
      fail_invalid("tensor '" + source + "' has shape " + shape_text(t->shape()) +
                   " but config.json implies " + shape_text(expected) +
                   "; the checkpoint and config.json disagree");
    }
    used[source] = true;
    // A quantized Linear (ir/quantized_linear.h) brings its scale along.
    if (const QuantRecord* r = weights.find_quant_record(source)) used[r->scale] = true;
    GgufTensorPlan p;
    p.source = source;
    p.name = gguf_name;
    p.shape = t->shape();
    p.type = type_for(gguf_name, p.shape, out, is_output);
    p.permute_heads = permute_heads;
    plan.push_back(std::move(p));
  };
  add("model.embed_tokens.weight", "token_embd.weight", {f.vocab, f.hidden}, 0, false,
      !has_output);
  for (int64_t i = 0; i < f.layers; ++i) {
    const std::string hf = "model.layers." + std::to_string(i) + ".";
    const std::string blk = "blk." + std::to_string(i) + ".";
    for (const auto& lt : gguf::decoder_layer_tensors()) {
      if (lt.qk_norm && !family.qk_norm) continue;
      std::vector<int64_t> shape;
      for (Dim d : lt.shape) shape.push_back(dim_value(d, f));
      int64_t heads = lt.rope == 'q' ? f.heads : lt.rope == 'k' ? f.kv_heads : 0;
      if (!family.permute_qk) heads = 0;
      const bool optional = std::string_view(lt.hf).ends_with(".bias");
      add(hf + lt.hf, blk + lt.gguf, shape, heads, optional, false);
    }
  }
  add("model.norm.weight", "output_norm.weight", {f.hidden}, 0, false, false);
  if (has_output) add("lm_head.weight", "output.weight", {f.vocab, f.hidden}, 0, false, true);
  for (const auto& [name, was_used] : used) {
    // the converter drops rotary_emb.inv_freq (recomputed from rope.freq_base)
    if (was_used || name.ends_with("rotary_emb.inv_freq")) continue;
    fail_invalid("tensor '" + name + "' has no GGUF counterpart in a " +
                 std::to_string(f.layers) + "-layer " + family.hf_architecture +
                 "; the checkpoint and config.json disagree (or the model is a variant qforge "
                 "does not map)");
  }
  return plan;
}

void add_llama_metadata(gguf::GgufWriter& w, const HfConfig& c, const HfDecoderFacts& facts,
                        const std::string& model_name, const GgufOutType& out) {
  const Figures f = figures(c);
  const GgufFamily& family = gguf_family(c);
  const std::string a = std::string(family.arch) + ".";
  auto u32 = [](int64_t v, const char* key) {
    if (v < 0 || v > static_cast<int64_t>(UINT32_MAX)) {
      fail_invalid(std::string("config.json: ") + key + " " + std::to_string(v) +
                   " does not fit GGUF's uint32");
    }
    return static_cast<uint32_t>(v);
  };
  if (!facts.rope_type.empty() && facts.rope_type != "default") {
    fail_unsupported("config.json asks for RoPE scaling '" + facts.rope_type +
                     "'; GGUF export writes plain RoPE only (llama.cpp needs rope_freqs / "
                     "rope.scaling.* for it)");
  }
  w.add_string("general.architecture", family.arch);
  w.add_string("general.type", "model");
  w.add_string("general.name", model_name);
  w.add_u32(a + "block_count", u32(f.layers, "num_hidden_layers"));
  w.add_u32(a + "context_length",
            u32(required(c.max_position_embeddings, "max_position_embeddings"),
                "max_position_embeddings"));
  w.add_u32(a + "embedding_length", u32(f.hidden, "hidden_size"));
  w.add_u32(a + "feed_forward_length", u32(f.inter, "intermediate_size"));
  w.add_u32(a + "attention.head_count", u32(f.heads, "num_attention_heads"));
  w.add_u32(a + "attention.head_count_kv", u32(f.kv_heads, "num_key_value_heads"));
  if (c.rope_theta) w.add_f32(a + "rope.freq_base", static_cast<float>(*c.rope_theta));
  if (!facts.rms_norm_eps) {
    fail_invalid("config.json has no \"rms_norm_eps\"; GGUF export needs it for " + a +
                 "attention.layer_norm_rms_epsilon");
  }
  w.add_f32(a + "attention.layer_norm_rms_epsilon", static_cast<float>(*facts.rms_norm_eps));
  if (facts.head_dim_given) {
    w.add_u32(a + "attention.key_length", u32(f.head_dim, "head_dim"));
    w.add_u32(a + "attention.value_length", u32(f.head_dim, "head_dim"));
  }
  w.add_u32("general.file_type", static_cast<uint32_t>(out.file_type));
  if (family.llama_keys) {
    w.add_u32(a + "vocab_size", u32(f.vocab, "vocab_size"));
    w.add_u32(a + "rope.dimension_count", u32(f.head_dim, "head_dim"));
  }
  w.add_u32("general.quantization_version", gguf::kQuantizationVersion);
}

std::vector<float> permute_rope_rows(std::span<const float> w, int64_t rows, int64_t cols,
                                     int64_t heads) {
  if (heads <= 0 || rows % (2 * heads) != 0 || static_cast<int64_t>(w.size()) != rows * cols) {
    fail_internal("permute_rope_rows: " + std::to_string(rows) + " rows over " +
                  std::to_string(heads) + " heads");
  }
  const int64_t per_head = rows / heads;
  const int64_t half = per_head / 2;
  std::vector<float> out(w.size());
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t s = 0; s < 2; ++s) {
      for (int64_t i = 0; i < half; ++i) {
        const int64_t src = h * per_head + s * half + i;
        const int64_t dst = h * per_head + 2 * i + s;
        std::copy_n(w.begin() + src * cols, cols, out.begin() + dst * cols);
      }
    }
  }
  return out;
}

}  // namespace qforge::cli
