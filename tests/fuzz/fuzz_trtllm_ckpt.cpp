// libFuzzer target: a TensorRT-LLM checkpoint through read_trtllm_ckpt. The input is
// config.json's text, then (after the first NUL byte) a few bytes that shape the rank files:
// the harness builds every tensor a Llama checkpoint of that config holds, per rank, with the
// shapes the config implies (sizes clamped small), then the bytes pick tensors to drop, reshape,
// retype or leave, an extra stray tensor, the tensors' content, and a rank count off by one.
// Any exception other than qforge::Error, any crash or sanitizer report, or an accepted
// checkpoint whose records do not hold (Graph::check_quant_records) is a bug.
// Seeds: tests/fuzz/corpus/trtllm_ckpt (the configs qforge's trtllm-ckpt writer emits).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "importers/quantized_checkpoint/trtllm_ckpt_reader.h"
#include "ir/error.h"

#include "abort_on_internal.h"

namespace {

struct Bytes {
  const uint8_t* p;
  size_t n;
  size_t i = 0;
  uint8_t next() { return n == 0 ? 0 : p[i++ % n]; }
};

int64_t dim(const nlohmann::json& j, const char* key, int64_t fallback) {
  const auto it = j.find(key);
  if (it == j.end() || !it->is_number_integer()) return fallback;
  return std::clamp<int64_t>(it->get<int64_t>(), 0, 64);
}

struct Spec {
  std::string name;
  qforge::DType dtype;
  qforge::Shape shape;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto* nul = static_cast<const uint8_t*>(std::memchr(data, 0, size));
  const size_t config_size = nul == nullptr ? size : static_cast<size_t>(nul - data);
  const std::string config(reinterpret_cast<const char*>(data), config_size);
  Bytes b{nul == nullptr ? nullptr : nul + 1, nul == nullptr ? 0 : size - config_size - 1};
  const nlohmann::json j = nlohmann::json::parse(config, nullptr, false);
  const nlohmann::json none = nlohmann::json::object();
  const nlohmann::json& c = j.is_object() ? j : none;
  const nlohmann::json& m = c.contains("mapping") && c["mapping"].is_object() ? c["mapping"] : none;
  const nlohmann::json& q =
      c.contains("quantization") && c["quantization"].is_object() ? c["quantization"] : none;
  const int64_t tp = std::clamp<int64_t>(dim(m, "tp_size", 1), 1, 4);
  const int64_t layers = std::min<int64_t>(dim(c, "num_hidden_layers", 1), 2);
  const int64_t hidden = dim(c, "hidden_size", 8);
  const int64_t heads = std::max<int64_t>(dim(c, "num_attention_heads", 1), 1);
  const int64_t kv = std::max<int64_t>(dim(c, "num_key_value_heads", heads), 1);
  const int64_t head = dim(c, "head_size", hidden / heads);
  const int64_t inter = dim(c, "intermediate_size", 8), vocab = dim(c, "vocab_size", 8);
  const int64_t group = std::max<int64_t>(dim(q, "group_size", 64), 1);
  const bool pre = q.contains("pre_quant_scale") && q["pre_quant_scale"] == true;
  // The harness reads only what it needs to build tensors; a config whose dtype is not a string
  // is still handed to the reader, which must refuse it with qforge::Error.
  const bool bf16 = c.contains("dtype") && c["dtype"] == "bfloat16";
  const qforge::DType ft = bf16 ? qforge::DType::BF16 : qforge::DType::F16;
  const uint8_t flags = b.next();
  std::vector<Spec> specs;
  const int64_t vrows = (vocab + tp - 1) / tp;
  specs.push_back({"transformer.vocab_embedding.weight", ft, {vocab, hidden}});
  specs.push_back({"transformer.ln_f.weight", ft, {hidden}});
  specs.push_back({"lm_head.weight", ft, {vrows, hidden}});
  for (int64_t l = 0; l < layers; ++l) {
    const std::string p = "transformer.layers." + std::to_string(l) + ".";
    specs.push_back({p + "input_layernorm.weight", ft, {hidden}});
    specs.push_back({p + "post_layernorm.weight", ft, {hidden}});
    const struct {
      const char* name;
      int64_t rows, k;
    } linears[] = {{"attention.qkv", (heads + 2 * kv) * head / tp, hidden},
                   {"attention.dense", hidden, heads * head / tp},
                   {"mlp.fc", inter / tp, hidden},
                   {"mlp.gate", inter / tp, hidden},
                   {"mlp.proj", hidden, inter / tp}};
    for (const auto& lin : linears) {
      const std::string n = p + lin.name;
      if ((flags & 1) && lin.name[0] == 'm' && lin.name[4] == 'p') {  // mlp.proj left float
        specs.push_back({n + ".weight", ft, {lin.rows, lin.k}});
        continue;
      }
      specs.push_back({n + ".weight", qforge::DType::I8, {lin.rows / 2, lin.k}});
      specs.push_back({n + ".weights_scaling_factor", ft, {lin.rows, lin.k / group}});
      if (pre) specs.push_back({n + ".prequant_scaling_factor", ft, {lin.k}});
    }
  }
  // Perturbations, chosen by the bytes.
  const size_t victim = specs.empty() ? 0 : b.next() % specs.size();
  const uint8_t mode = b.next() % 5;
  const int ranks = static_cast<int>(tp) + ((flags & 2) ? (flags & 4 ? 1 : -1) : 0);
  std::vector<qforge::Graph> graphs(static_cast<size_t>(std::max(ranks, 0)));
  uint64_t total = 0;
  for (qforge::Graph& g : graphs) {
    for (size_t i = 0; i < specs.size(); ++i) {
      Spec s = specs[i];
      if (i == victim && (flags & 8)) {
        if (mode == 0) continue;
        if (mode == 1 && !s.shape.empty()) s.shape[0] += 1;
        if (mode == 2) s.dtype = qforge::DType::F32;
        if (mode == 3) s.dtype = qforge::DType::U8;
      }
      qforge::Tensor t(s.dtype, s.shape);
      total += t.nbytes();
      if (total > (1u << 20)) return 0;
      const bool noise = (flags & 16) || (i == victim && mode == 4);
      for (auto& x : t.mutable_bytes()) x = static_cast<std::byte>(noise ? b.next() : 0x3c);
      g.set_initializer(s.name, std::move(t));
    }
    if (flags & 32) g.set_initializer("transformer.layers.0.attention.qkv.bias",
                                      qforge::Tensor(ft, {1}));
  }
  try {
    qforge::TrtllmCheckpoint ckpt = qforge::read_trtllm_ckpt(config, "fuzz/config.json", graphs);
    ckpt.graph.check_quant_records();
  } catch (const qforge::Error& e) {
    qforge::fuzz::abort_on_internal(e);
  }
  return 0;
}
