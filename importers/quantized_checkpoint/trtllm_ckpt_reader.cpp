#include "importers/quantized_checkpoint/trtllm_ckpt_reader.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "importers/quantized_checkpoint/modelopt_int4.h"
#include "importers/safetensors/safetensors_reader.h"
#include "ir/error.h"
#include "ir/quantized_linear.h"
#include "ir/tied_weights.h"

namespace qforge {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using ordered_json = nlohmann::ordered_json;

constexpr int64_t kMaxDim = int64_t{1} << 31;
constexpr int64_t kMaxLayers = 100000;
constexpr int kMaxRanks = 1024;
// TensorRT-LLM's QuantConfig default for group-wise int4 (REFERENCE.md 3.5).
constexpr int64_t kDefaultGroup = 64;

struct Config {
  std::string file;
  std::string architecture;
  DType dtype = DType::F16;
  std::string dtype_name;
  int64_t layers = 0, hidden = 0, heads = 0, kv_heads = 0, head = 0, inter = 0, vocab = 0;
  int tp = 1;
  bool tied = false;
  bool parallel_embedding = false;
  int64_t sharding_dim = 0;
  std::string algo;
  int64_t group = kDefaultGroup;
  bool pre_quant = false;
  std::vector<std::string> exclude;
  ordered_json hf;  // the Hugging Face config synthesized
};

[[noreturn]] void bad(const Config& c, const std::string& what) {
  fail_invalid("'" + c.file + "' (trtllm-ckpt): " + what);
}

[[noreturn]] void unsupported(const Config& c, const std::string& what) {
  fail_unsupported("'" + c.file + "' (trtllm-ckpt): " + what);
}

const json* find_key(const json& j, const char* key) {
  const auto it = j.find(key);
  return it == j.end() || it->is_null() ? nullptr : &*it;
}

int64_t int_of(const Config& c, const json& j, const char* key, std::optional<int64_t> fallback,
               int64_t max = kMaxDim) {
  const json* v = find_key(j, key);
  if (v == nullptr) {
    if (!fallback) bad(c, "config has no \"" + std::string(key) + "\"");
    return *fallback;
  }
  if (!v->is_number_integer() || v->get<int64_t>() <= 0 || v->get<int64_t>() > max) {
    bad(c, "\"" + std::string(key) + "\" is " + v->dump() + ", not a positive integer");
  }
  return v->get<int64_t>();
}

bool bool_of(const Config& c, const json& j, const char* key) {
  const json* v = find_key(j, key);
  if (v == nullptr) return false;
  if (!v->is_boolean()) bad(c, "\"" + std::string(key) + "\" is " + v->dump() + ", not a bool");
  return v->get<bool>();
}

double number_of(const Config& c, const json& j, const char* key, double fallback) {
  const json* v = find_key(j, key);
  if (v == nullptr) return fallback;
  if (!v->is_number()) bad(c, "\"" + std::string(key) + "\" is " + v->dump() + ", not a number");
  return v->get<double>();
}

Config parse_config(const std::string& text, const std::string& file) {
  Config c;
  c.file = file;
  const json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) fail_invalid("'" + file + "' is not a JSON object");
  const json* arch = find_key(j, "architecture");
  if (arch == nullptr || !arch->is_string()) bad(c, "config has no \"architecture\" string");
  c.architecture = arch->get<std::string>();
  if (c.architecture != "LlamaForCausalLM" && c.architecture != "MistralForCausalLM") {
    unsupported(c, "architecture '" + c.architecture + "'; qforge reads TensorRT-LLM's Llama "
                   "checkpoint (LlamaForCausalLM, MistralForCausalLM)");
  }
  const json* dtype = find_key(j, "dtype");
  if (dtype == nullptr || !dtype->is_string()) bad(c, "config has no \"dtype\" string");
  c.dtype_name = dtype->get<std::string>();
  if (c.dtype_name == "float16") {
    c.dtype = DType::F16;
  } else if (c.dtype_name == "bfloat16") {
    c.dtype = DType::BF16;
  } else if (c.dtype_name == "float32") {
    c.dtype = DType::F32;
  } else {
    unsupported(c, "dtype '" + c.dtype_name + "'; qforge reads float16, bfloat16 and float32");
  }
  c.layers = int_of(c, j, "num_hidden_layers", std::nullopt, kMaxLayers);
  c.hidden = int_of(c, j, "hidden_size", std::nullopt);
  c.heads = int_of(c, j, "num_attention_heads", std::nullopt);
  c.kv_heads = int_of(c, j, "num_key_value_heads", c.heads);
  c.head = int_of(c, j, "head_size", c.hidden / c.heads > 0 ? c.hidden / c.heads : 1);
  c.inter = int_of(c, j, "intermediate_size", std::nullopt);
  c.vocab = int_of(c, j, "vocab_size", std::nullopt);
  if (c.heads % c.kv_heads != 0 || c.heads * c.head > kMaxDim) {
    bad(c, std::to_string(c.heads) + " heads and " + std::to_string(c.kv_heads) + " key/value "
           "heads of size " + std::to_string(c.head) + " do not describe an attention layer");
  }
  const std::string pos = find_key(j, "position_embedding_type") != nullptr &&
                                  j["position_embedding_type"].is_string()
                              ? j["position_embedding_type"].get<std::string>()
                              : std::string("rope_gpt_neox");
  if (pos != "rope_gpt_neox") {
    unsupported(c, "position_embedding_type '" + pos + "'; qforge reads Llama's rope_gpt_neox");
  }
  for (const char* key : {"mlp_bias", "attn_bias", "bias", "qk_layernorm", "residual_mlp"}) {
    if (bool_of(c, j, key)) unsupported(c, std::string(key) + " is true; qforge reads Llama "
                                            "checkpoints without biases or extra norms");
  }
  if (const json* moe = find_key(j, "moe"); moe != nullptr && moe->is_object() &&
                                            moe->value("num_experts", 0) > 0) {
    unsupported(c, "moe.num_experts " + (*moe)["num_experts"].dump() + "; qforge reads dense "
                   "Llama checkpoints");
  }
  const json* mapping = find_key(j, "mapping");
  const json none = json::object();
  const json& m = mapping != nullptr && mapping->is_object() ? *mapping : none;
  c.tp = static_cast<int>(int_of(c, m, "tp_size", 1, kMaxRanks));
  const int64_t pp = int_of(c, m, "pp_size", 1, kMaxRanks);
  const int64_t cp = int_of(c, m, "cp_size", 1, kMaxRanks);
  const int64_t world = int_of(c, m, "world_size", c.tp * pp * cp, kMaxRanks * kMaxRanks);
  if (world != c.tp * pp * cp) {
    bad(c, "mapping.world_size " + std::to_string(world) + " is not tp_size " +
           std::to_string(c.tp) + " x pp_size " + std::to_string(pp) + " x cp_size " +
           std::to_string(cp));
  }
  if (pp != 1 || cp != 1) {
    unsupported(c, "mapping.pp_size " + std::to_string(pp) + ", cp_size " + std::to_string(cp) +
                   "; qforge reads tensor-parallel checkpoints (pp_size and cp_size 1)");
  }
  if (c.heads % c.tp != 0 || c.kv_heads % c.tp != 0) {
    unsupported(c, "tp_size " + std::to_string(c.tp) + " does not divide the " +
                   std::to_string(c.heads) + " heads and " + std::to_string(c.kv_heads) +
                   " key/value heads (the converter duplicates key/value heads then); qforge "
                   "reads a tp that divides both");
  }
  if (c.hidden % c.tp != 0 || c.inter % c.tp != 0) {
    bad(c, "tp_size " + std::to_string(c.tp) + " does not divide hidden_size " +
           std::to_string(c.hidden) + " and intermediate_size " + std::to_string(c.inter));
  }
  c.tied = bool_of(c, j, "tie_word_embeddings") || bool_of(c, j, "share_embedding_table");
  c.parallel_embedding = bool_of(c, j, "use_parallel_embedding");
  if (c.parallel_embedding) {
    const json* d = find_key(j, "embedding_sharding_dim");
    c.sharding_dim = d != nullptr && d->is_number_integer() ? d->get<int64_t>() : 0;
    if (c.sharding_dim != 0 && c.sharding_dim != 1) {
      bad(c, "embedding_sharding_dim " + d->dump() + " is not 0 or 1");
    }
  }
  const json* q = find_key(j, "quantization");
  if (q != nullptr && !q->is_object()) bad(c, "\"quantization\" is " + q->dump());
  const json* algo = q != nullptr ? find_key(*q, "quant_algo") : nullptr;
  if (algo == nullptr) {
    unsupported(c, "quantization.quant_algo is null (float weights); qforge reads quantized "
                   "TensorRT-LLM checkpoints: convert the Hugging Face model instead");
  }
  if (!algo->is_string()) bad(c, "quantization.quant_algo is " + algo->dump());
  c.algo = algo->get<std::string>();
  if (const json* kv = find_key(*q, "kv_cache_quant_algo")) {
    unsupported(c, "quantization.kv_cache_quant_algo " + kv->dump() + " quantizes the KV cache; "
                   "qforge reads weight-only checkpoints");
  }
  if (c.algo == "W4A16" || c.algo == "W8A16") {
    unsupported(c, "quant_algo " + c.algo + ": TensorRT-LLM's converter stores these per-channel "
                   "int weights already interleaved for the mixed GEMM of the GPU that converted "
                   "them (preprocess_weights_for_mixed_gemm), so the integers cannot be read "
                   "portably; qforge reads W4A16_AWQ (group-wise int4)");
  }
  if (c.algo != "W4A16_AWQ") {
    unsupported(c, "quant_algo '" + c.algo + "'; qforge reads W4A16_AWQ (group-wise int4)");
  }
  c.group = int_of(c, *q, "group_size", kDefaultGroup);
  if (bool_of(c, *q, "has_zero_point")) {
    unsupported(c, "quantization.has_zero_point is true; qforge reads symmetric int4");
  }
  c.pre_quant = bool_of(c, *q, "pre_quant_scale");
  if (const json* ex = find_key(*q, "exclude_modules")) {
    if (!ex->is_array()) bad(c, "quantization.exclude_modules is " + ex->dump());
    for (const json& e : *ex) {
      if (!e.is_string()) bad(c, "quantization.exclude_modules holds " + e.dump());
      c.exclude.push_back(e.get<std::string>());
    }
  }

  // The Hugging Face config of the same decoder.
  const bool mistral = c.architecture == "MistralForCausalLM";
  ordered_json& hf = c.hf;
  hf["architectures"] = ordered_json::array({c.architecture});
  hf["model_type"] = mistral ? "mistral" : "llama";
  hf["vocab_size"] = c.vocab;
  hf["hidden_size"] = c.hidden;
  hf["intermediate_size"] = c.inter;
  hf["num_hidden_layers"] = c.layers;
  hf["num_attention_heads"] = c.heads;
  hf["num_key_value_heads"] = c.kv_heads;
  hf["head_dim"] = c.head;
  const json* act = find_key(j, "hidden_act");
  hf["hidden_act"] = act != nullptr && act->is_string() ? act->get<std::string>() : "silu";
  hf["max_position_embeddings"] = int_of(c, j, "max_position_embeddings", 2048);
  hf["rms_norm_eps"] = number_of(c, j, "norm_epsilon", 1e-5);
  hf["rope_theta"] = number_of(c, j, "rotary_base", 10000.0);
  const json* scaling = find_key(j, "rotary_scaling");
  if (scaling != nullptr && !scaling->is_object()) bad(c, "rotary_scaling is " + scaling->dump());
  hf["rope_scaling"] = scaling != nullptr ? ordered_json(*scaling) : ordered_json();
  hf["tie_word_embeddings"] = c.tied;
  hf["attention_bias"] = false;
  if (!mistral) hf["mlp_bias"] = false;
  if (mistral) hf["sliding_window"] = nullptr;  // the engine attends to the whole context
  hf["torch_dtype"] = c.dtype_name;
  return c;
}

// A row-major 2-D block of elements `es` bytes each: int8 values (es 1) or float tensors.
struct Mat {
  int64_t rows = 0, cols = 0;
  size_t es = 1;
  DType dtype = DType::I8;
  std::vector<uint8_t> bytes;

  Mat rows_slice(int64_t r0, int64_t r1) const {
    Mat m{r1 - r0, cols, es, dtype, {}};
    const size_t row = static_cast<size_t>(cols) * es;
    m.bytes.assign(bytes.begin() + static_cast<ptrdiff_t>(static_cast<size_t>(r0) * row),
                   bytes.begin() + static_cast<ptrdiff_t>(static_cast<size_t>(r1) * row));
    return m;
  }
};

Mat from_tensor(const Tensor& t) {
  Mat m;
  m.rows = t.shape()[0];
  m.cols = t.rank() == 2 ? t.shape()[1] : 1;
  m.es = static_cast<size_t>(dtype_bits(t.dtype()) / 8);
  m.dtype = t.dtype();
  const auto b = t.bytes();
  m.bytes.assign(reinterpret_cast<const uint8_t*>(b.data()),
                 reinterpret_cast<const uint8_t*>(b.data()) + b.size());
  return m;
}

Mat concat_rows(const std::vector<Mat>& parts) {
  Mat m = parts[0];
  for (size_t i = 1; i < parts.size(); ++i) {
    m.rows += parts[i].rows;
    m.bytes.insert(m.bytes.end(), parts[i].bytes.begin(), parts[i].bytes.end());
  }
  return m;
}

Mat concat_cols(const std::vector<Mat>& parts) {
  Mat m{parts[0].rows, 0, parts[0].es, parts[0].dtype, {}};
  for (const Mat& p : parts) m.cols += p.cols;
  m.bytes.resize(static_cast<size_t>(m.rows * m.cols) * m.es);
  size_t at = 0;
  for (const Mat& p : parts) {
    const size_t w = static_cast<size_t>(p.cols) * p.es;
    for (int64_t r = 0; r < m.rows; ++r) {
      std::memcpy(m.bytes.data() + static_cast<size_t>(r * m.cols) * m.es + at,
                  p.bytes.data() + static_cast<size_t>(r) * w, w);
    }
    at += w;
  }
  return m;
}

Tensor to_tensor(const Mat& m, bool vector) {
  Tensor t(m.dtype, vector ? Shape{m.rows} : Shape{m.rows, m.cols});
  std::memcpy(t.mutable_bytes().data(), m.bytes.data(), m.bytes.size());
  return t;
}

// One Linear of TensorRT-LLM's Llama and the Hugging Face modules it holds.
enum class Split { Qkv, Column, Row };

struct LinearSpec {
  const char* trt;  // "attention.qkv"
  Split split;
  std::vector<const char*> hf;  // "self_attn.q_proj", ...
};

const LinearSpec kLinears[] = {
    {"attention.qkv", Split::Qkv, {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"}},
    {"attention.dense", Split::Row, {"self_attn.o_proj"}},
    {"mlp.fc", Split::Column, {"mlp.gate_proj"}},  // TensorRT-LLM's fc is HF's gate_proj
    {"mlp.gate", Split::Column, {"mlp.up_proj"}},  // and its gate HF's up_proj
    {"mlp.proj", Split::Row, {"mlp.down_proj"}},
};

class Reader {
 public:
  Reader(const Config& c, const std::vector<Graph>& ranks) : c_(c), ranks_(ranks) {
    for (const Graph& g : ranks) {
      std::set<std::string> names;
      for (const auto& [name, t] : g.initializers()) names.insert(name);
      unread_.push_back(std::move(names));
    }
  }

  [[noreturn]] void tensor_error(int r, const std::string& name, const std::string& what) const {
    bad(c_, "rank" + std::to_string(r) + ".safetensors: tensor '" + name + "' " + what);
  }

  const Tensor* find(int r, const std::string& name) {
    const Tensor* t = ranks_[static_cast<size_t>(r)].find_initializer(name);
    if (t != nullptr) unread_[static_cast<size_t>(r)].erase(name);
    return t;
  }

  const Tensor& need(int r, const std::string& name) {
    const Tensor* t = find(r, name);
    if (t == nullptr) {
      bad(c_, "rank" + std::to_string(r) + ".safetensors has no tensor '" + name + "'");
    }
    return *t;
  }

  void expect_float(int r, const std::string& name, const Tensor& t, const Shape& shape) const {
    if (!dtype_is_float(t.dtype()) || t.shape() != shape) {
      tensor_error(r, name, "is " + std::string(dtype_name(t.dtype())) + " " +
                                shape_to_string(t.shape()) + "; config.json makes it a float " +
                                shape_to_string(shape));
    }
  }

  // A tensor every rank holds whole: rank 0's, the others equal to it.
  Tensor replicated(const std::string& name, const Shape& shape) {
    const Tensor& t0 = need(0, name);
    expect_float(0, name, t0, shape);
    for (int r = 1; r < c_.tp; ++r) {
      const Tensor& t = need(r, name);
      if (t.dtype() != t0.dtype() || t.shape() != t0.shape() || !t.equals(t0)) {
        tensor_error(r, name, "differs from rank0's: TensorRT-LLM keeps it whole on every rank");
      }
    }
    return t0;
  }

  // The vocabulary rows [vocab_padded / tp, cols] of every rank, the padding (zero rows) dropped.
  Tensor vocabulary(const std::string& name, int64_t cols) {
    const int64_t padded = (c_.vocab + c_.tp - 1) / c_.tp * c_.tp;
    std::vector<Mat> parts;
    for (int r = 0; r < c_.tp; ++r) {
      const Tensor& t = need(r, name);
      expect_float(r, name, t, {padded / c_.tp, cols});
      if (r > 0 && t.dtype() != parts[0].dtype) tensor_error(r, name, "has another dtype");
      parts.push_back(from_tensor(t));
    }
    Mat all = concat_rows(parts);
    const size_t keep = static_cast<size_t>(c_.vocab * cols) * all.es;
    for (size_t i = keep; i < all.bytes.size(); ++i) {
      if (all.bytes[i] != 0) {
        tensor_error(c_.tp - 1, name, "has a non-zero value in its vocabulary padding (rows " +
                                          std::to_string(c_.vocab) + " to " +
                                          std::to_string(padded) + " of the merged tensor)");
      }
    }
    return to_tensor(all.rows_slice(0, c_.vocab), false);
  }

  Tensor embedding(int64_t hidden) {
    const std::string name = "transformer.vocab_embedding.weight";
    if (!c_.parallel_embedding) return replicated(name, {c_.vocab, hidden});
    if (c_.sharding_dim == 0) return vocabulary(name, hidden);
    std::vector<Mat> parts;
    for (int r = 0; r < c_.tp; ++r) {
      const Tensor& t = need(r, name);
      expect_float(r, name, t, {c_.vocab, hidden / c_.tp});
      if (r > 0 && t.dtype() != parts[0].dtype) tensor_error(r, name, "has another dtype");
      parts.push_back(from_tensor(t));
    }
    return to_tensor(concat_cols(parts), false);
  }

  bool excluded(const std::string& module) const {
    for (const std::string& p : c_.exclude) {
      if (module_pattern_match(p, module)) return true;
    }
    return false;
  }

  // One TensorRT-LLM Linear of layer `layer`, merged over the ranks and split into its Hugging
  // Face modules, added to `out`.
  void linear(int64_t layer, const LinearSpec& spec, Graph& out, QuantizedCheckpoint& q) {
    const std::string module = "transformer.layers." + std::to_string(layer) + "." + spec.trt;
    const std::string wname = module + ".weight", sname = module + ".weights_scaling_factor",
                      pname = module + ".prequant_scaling_factor";
    const int64_t hd = c_.head;
    // Per-rank rows and columns, and each HF part's rows per rank.
    std::vector<int64_t> part_rows;
    int64_t k = c_.hidden;
    switch (spec.split) {
      case Split::Qkv:
        part_rows = {c_.heads / c_.tp * hd, c_.kv_heads / c_.tp * hd, c_.kv_heads / c_.tp * hd};
        break;
      case Split::Column: part_rows = {c_.inter / c_.tp}; break;
      case Split::Row:
        part_rows = {c_.hidden};
        k = spec.trt == std::string_view("attention.dense") ? c_.heads * hd : c_.inter;
        break;
    }
    const bool row_parallel = spec.split == Split::Row;
    if (row_parallel && k % c_.tp != 0) {
      bad(c_, "tp_size " + std::to_string(c_.tp) + " does not divide the " + std::to_string(k) +
              " inputs of " + module);
    }
    const int64_t kr = row_parallel ? k / c_.tp : k;
    int64_t rows = 0;
    for (const int64_t p : part_rows) rows += p;
    const bool quantized = ranks_[0].has_initializer(sname);
    if (quantized && excluded(module)) {
      tensor_error(0, sname, "quantizes " + module + ", which quantization.exclude_modules "
                             "leaves float");
    }
    if (!quantized && !excluded(module)) {
      tensor_error(0, wname, "is float, but quantization.exclude_modules does not list " +
                                 module + " (quant_algo " + c_.algo + " quantizes it)");
    }
    std::vector<Mat> values, scales;
    std::vector<Mat> pre;
    for (int r = 0; r < c_.tp; ++r) {
      const Tensor& w = need(r, wname);
      if (!quantized) {
        if (ranks_[static_cast<size_t>(r)].has_initializer(sname)) {
          tensor_error(r, sname, "is on this rank but not on rank0");
        }
        expect_float(r, wname, w, {rows, kr});
        if (r > 0 && w.dtype() != values[0].dtype) tensor_error(r, wname, "has another dtype");
        values.push_back(from_tensor(w));
        continue;
      }
      const Tensor* s = find(r, sname);
      if (s == nullptr) tensor_error(r, wname, "has no " + sname + " beside it (rank0 has)");
      if (rows % 2 != 0 || (w.dtype() != DType::I8 && w.dtype() != DType::U8) ||
          w.shape() != Shape{rows / 2, kr}) {
        tensor_error(r, wname, "is " + std::string(dtype_name(w.dtype())) + " " +
                                   shape_to_string(w.shape()) + "; config.json makes it int8 [" +
                                   std::to_string(rows) + " / 2, " + std::to_string(kr) +
                                   "] (two int4 output rows per byte)");
      }
      if (kr % c_.group != 0) {
        tensor_error(r, wname, "has " + std::to_string(kr) + " inputs on this rank, not whole "
                               "groups of quantization.group_size " + std::to_string(c_.group));
      }
      const Shape sshape{rows, kr / c_.group};
      if (!dtype_is_float(s->dtype()) || s->shape() != sshape) {
        tensor_error(r, sname, "is " + std::string(dtype_name(s->dtype())) + " " +
                                   shape_to_string(s->shape()) + "; group_size " +
                                   std::to_string(c_.group) + " and " + wname +
                                   " make it a float " + shape_to_string(sshape));
      }
      if (r > 0 && s->dtype() != scales[0].dtype) tensor_error(r, sname, "has another dtype");
      const std::vector<int8_t> q8 = unpack_int4_row_pairs(w.data<uint8_t>(), rows, kr);
      Mat v{rows, kr, 1, DType::I8, {}};
      v.bytes.assign(reinterpret_cast<const uint8_t*>(q8.data()),
                     reinterpret_cast<const uint8_t*>(q8.data()) + q8.size());
      values.push_back(std::move(v));
      scales.push_back(from_tensor(*s));
      const Tensor* p = find(r, pname);
      if (c_.pre_quant && p == nullptr) {
        tensor_error(r, wname, "has no " + pname + " beside it (quantization.pre_quant_scale is "
                               "true)");
      }
      if (!c_.pre_quant && p != nullptr) {
        tensor_error(r, pname, "is stored, but quantization.pre_quant_scale is false");
      }
      if (p != nullptr) {
        expect_float(r, pname, *p, {kr});
        if (r > 0 && p->dtype() != pre[0].dtype) tensor_error(r, pname, "has another dtype");
        pre.push_back(from_tensor(*p));
      }
    }
    // Each HF part: its rows of every rank, one after another (column-parallel), or the ranks'
    // columns side by side (row-parallel).
    std::optional<Mat> pqs;
    if (!pre.empty()) {
      if (row_parallel) {
        pqs = concat_rows(pre);  // [kr] slices, one after another along K
      } else {
        for (int r = 1; r < c_.tp; ++r) {
          if (pre[static_cast<size_t>(r)].bytes != pre[0].bytes) {
            tensor_error(r, pname, "differs from rank0's (a column-parallel Linear's input is "
                                   "whole on every rank)");
          }
        }
        pqs = pre[0];
      }
    }
    int64_t at = 0;
    for (size_t i = 0; i < spec.hf.size(); ++i) {
      const std::string hf =
          "model.layers." + std::to_string(layer) + "." + spec.hf[i] + ".weight";
      std::vector<Mat> vparts, sparts;
      for (int r = 0; r < c_.tp; ++r) {
        vparts.push_back(values[static_cast<size_t>(r)].rows_slice(at, at + part_rows[i]));
        if (quantized) {
          sparts.push_back(scales[static_cast<size_t>(r)].rows_slice(at, at + part_rows[i]));
        }
      }
      const Mat v = row_parallel ? concat_cols(vparts) : concat_rows(vparts);
      at += part_rows[i];
      if (!quantized) {
        out.set_initializer(hf, to_tensor(v, false));
        q.ignore.push_back(hf.substr(0, hf.size() - 7));
        continue;
      }
      Tensor scale = to_tensor(row_parallel ? concat_cols(sparts) : concat_rows(sparts), false);
      if (pqs) {
        scale = fold_pre_quant_scale(scale, c_.group, k, to_tensor(*pqs, true), pname,
                                     "'" + c_.file + "' (trtllm-ckpt): ");
      }
      scale = narrow_scale(scale, c_.dtype);
      Tensor ints = linear_values_tensor(
          std::span<const int8_t>(reinterpret_cast<const int8_t*>(v.bytes.data()), v.bytes.size()),
          4, v.rows, v.cols);
      store_quantized_linear(out, hf, std::move(ints), std::move(scale), c_.group);
      ++q.schemes[0].linears;
      ++q.quantized_linears;
    }
  }

  void check_all_read() const {
    for (size_t r = 0; r < unread_.size(); ++r) {
      if (!unread_[r].empty()) {
        unsupported(c_, "rank" + std::to_string(r) + ".safetensors holds '" +
                            *unread_[r].begin() + "', which has no place in a Llama checkpoint "
                            "qforge reads (biases, activation or KV-cache scales, other "
                            "architectures' tensors)");
      }
    }
  }

 private:
  const Config& c_;
  const std::vector<Graph>& ranks_;
  std::vector<std::set<std::string>> unread_;
};

}  // namespace

bool is_trtllm_ckpt_folder(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_regular_file(dir / "rank0.safetensors", ec) ||
      !fs::is_regular_file(dir / "config.json", ec)) {
    return false;
  }
  std::ifstream in(dir / "config.json", std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  const json j = json::parse(text.str(), nullptr, false);
  return j.is_object() && j.contains("architecture") && j["architecture"].is_string() &&
         !j.contains("architectures");
}

TrtllmCheckpoint read_trtllm_ckpt(const std::string& config_text, const std::string& file,
                                  const std::vector<Graph>& ranks) {
  const Config c = parse_config(config_text, file);
  if (static_cast<int>(ranks.size()) != c.tp) {
    bad(c, "mapping.world_size is " + std::to_string(c.tp) + ", and there are " +
               std::to_string(ranks.size()) + " rank files");
  }
  Reader reader(c, ranks);
  TrtllmCheckpoint out;
  out.tp = c.tp;
  QuantizedCheckpoint& q = out.quantized;
  q.quant_method = std::string(kTrtllmCkptMethod);
  q.format = c.algo;
  QuantizedScheme scheme;
  scheme.bits = 4;
  scheme.group_size = c.group;
  q.schemes.push_back(scheme);
  q.ignore.emplace_back("lm_head");
  Graph& g = out.graph;
  const Tensor embedding = reader.embedding(c.hidden);
  g.set_initializer("model.embed_tokens.weight", embedding);
  for (int64_t layer = 0; layer < c.layers; ++layer) {
    const std::string trt = "transformer.layers." + std::to_string(layer) + ".";
    const std::string hf = "model.layers." + std::to_string(layer) + ".";
    g.set_initializer(hf + "input_layernorm.weight",
                      reader.replicated(trt + "input_layernorm.weight", {c.hidden}));
    reader.linear(layer, kLinears[0], g, q);
    reader.linear(layer, kLinears[1], g, q);
    g.set_initializer(hf + "post_attention_layernorm.weight",
                      reader.replicated(trt + "post_layernorm.weight", {c.hidden}));
    for (size_t i = 2; i < std::size(kLinears); ++i) reader.linear(layer, kLinears[i], g, q);
  }
  g.set_initializer("model.norm.weight", reader.replicated("transformer.ln_f.weight", {c.hidden}));
  const bool has_head = ranks[0].has_initializer("lm_head.weight");
  if (ranks[0].has_initializer("lm_head.weights_scaling_factor")) {
    unsupported(c, "lm_head is quantized; qforge reads checkpoints whose lm_head is float");
  }
  if (has_head || !c.tied) {
    const Tensor head = reader.vocabulary("lm_head.weight", c.hidden);
    if (c.tied) {
      if (head.dtype() != embedding.dtype() || !head.equals(embedding)) {
        bad(c, "tie_word_embeddings is true, but lm_head.weight (its vocabulary padding "
               "dropped) differs from transformer.vocab_embedding.weight");
      }
    } else {
      g.set_initializer("lm_head.weight", head);
    }
  }
  if (c.tied) set_tied_weights(g, {{"lm_head.weight", "model.embed_tokens.weight"}});
  reader.check_all_read();
  out.hf_config = c.hf.dump(2) + "\n";
  return out;
}

TrtllmCheckpoint load_trtllm_ckpt(const fs::path& dir) {
  const fs::path config = dir / "config.json";
  std::ifstream in(config, std::ios::binary);
  if (!in) fail_io("cannot read '" + config.string() + "'");
  std::ostringstream text;
  text << in.rdbuf();
  // The settings first, so that an unsupported mapping is named before a missing rank file.
  const Config c = parse_config(text.str(), config.string());
  std::vector<Graph> ranks;
  std::error_code ec;
  for (int r = 0; r < c.tp; ++r) {
    const fs::path f = dir / ("rank" + std::to_string(r) + ".safetensors");
    if (!fs::is_regular_file(f, ec)) {
      bad(c, "mapping.world_size is " + std::to_string(c.tp) + ", and '" + f.string() +
                 "' is missing");
    }
    ranks.push_back(import_safetensors(f));
  }
  const fs::path extra = dir / ("rank" + std::to_string(c.tp) + ".safetensors");
  if (fs::exists(extra, ec)) {
    bad(c, "mapping.world_size is " + std::to_string(c.tp) + ", and the folder also holds '" +
               extra.string() + "'");
  }
  return read_trtllm_ckpt(text.str(), config.string(), ranks);
}

}  // namespace qforge
