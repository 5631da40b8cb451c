// libFuzzer target: a ModelOpt Hugging Face export through read_modelopt. The input is
// config.json's text, then (after the first NUL byte) hf_quant_config.json's text (empty: no such
// file), then (after the second NUL) a few bytes that shape one module's tensors: the packed
// weight's dtype and dims, weight_scale's dtype, rank and dims, a pre_quant_scale (ones, one
// value per group, or fuzzed bytes), a stray packed lm_head or input_scale, and the bytes.
// Any exception other than qforge::Error, any crash or sanitizer report, or an accepted
// checkpoint whose records do not hold (Graph::check_quant_records) is a bug.
// Seeds: tests/fuzz/corpus/modelopt (the configs qforge's modelopt-hf writer and ModelOpt emit).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "importers/quantized_checkpoint/modelopt_reader.h"
#include "ir/error.h"

#include "abort_on_internal.h"

namespace {

const std::string kModule = "model.layers.0.self_attn.o_proj";

struct Bytes {
  const uint8_t* p;
  size_t n;
  size_t i = 0;
  uint8_t next() { return n == 0 ? 0 : p[i++ % n]; }
};

qforge::DType pick(uint8_t b) {
  using qforge::DType;
  constexpr DType kinds[] = {DType::U8, DType::I8, DType::F32, DType::F16, DType::BF16, DType::I32};
  return kinds[b % 6];
}

qforge::Tensor filled(qforge::DType dtype, qforge::Shape shape, Bytes& b) {
  qforge::Tensor t(dtype, std::move(shape));
  for (auto& x : t.mutable_bytes()) x = static_cast<std::byte>(b.next());
  return t;
}

// float values (ones, or one per group of `group`) as `dtype`.
qforge::Tensor floats(qforge::DType dtype, int64_t n, int64_t group, Bytes& b) {
  std::vector<float> v(static_cast<size_t>(n));
  float x = 1.0f;
  for (int64_t i = 0; i < n; ++i) {
    if (group > 0 && i % group == 0) x = 0.25f * static_cast<float>(1 + b.next() % 8);
    v[static_cast<size_t>(i)] = x;
  }
  return qforge::Tensor::from_f32(v, {n}, dtype);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto* nul = static_cast<const uint8_t*>(std::memchr(data, 0, size));
  const size_t config_size = nul == nullptr ? size : static_cast<size_t>(nul - data);
  const std::string config(reinterpret_cast<const char*>(data), config_size);
  std::string hf_quant;
  Bytes b{nullptr, 0};
  if (nul != nullptr) {
    const uint8_t* rest = nul + 1;
    const size_t left = size - config_size - 1;
    const auto* nul2 = static_cast<const uint8_t*>(std::memchr(rest, 0, left));
    const size_t hq = nul2 == nullptr ? left : static_cast<size_t>(nul2 - rest);
    hf_quant.assign(reinterpret_cast<const char*>(rest), hq);
    if (nul2 != nullptr) b = Bytes{nul2 + 1, left - hq - 1};
  }
  const uint8_t flags = b.next();
  const uint8_t more = b.next();
  const int64_t r0 = b.next() % 9, c0 = b.next() % 70;
  const qforge::DType wtype = pick(flags & 1 ? b.next() : 0);
  qforge::Graph graph;
  graph.set_initializer(kModule + ".weight", filled(wtype, {r0, c0}, b));
  if (!(flags & 2)) {
    const qforge::DType stype = pick(2 + b.next() % 4);
    const int64_t s0 = b.next() % 20, s1 = b.next() % 9;
    graph.set_initializer(kModule + ".weight_scale",
                          flags & 4 ? filled(stype, {s0}, b) : filled(stype, {s0, s1}, b));
  }
  if (flags & 8) {
    const int64_t k = more & 1 ? c0 : b.next() % 70;
    const qforge::DType ptype = pick(2 + b.next() % 3);
    graph.set_initializer(kModule + ".pre_quant_scale",
                          more & 2 ? filled(ptype, {k}, b)
                                   : floats(ptype, k, more & 4 ? 1 + b.next() % 40 : 0, b));
  }
  if (flags & 16) graph.set_initializer("lm_head.weight", filled(qforge::DType::U8, {2, 2}, b));
  if (flags & 32) {
    graph.set_initializer(kModule + ".input_scale", filled(qforge::DType::F32, {1}, b));
  }
  if (flags & 64) {
    graph.set_initializer("model.layers.1.mlp.down_proj.pre_quant_scale",
                          filled(qforge::DType::F16, {4}, b));
  }
  try {
    qforge::read_modelopt(config, "fuzz/config.json", hf_quant, "fuzz/hf_quant_config.json",
                          graph);
    graph.check_quant_records();
  } catch (const qforge::Error& e) {
    qforge::fuzz::abort_on_internal(e);
  }
  return 0;
}
