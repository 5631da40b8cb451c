// libFuzzer target: a GPTQ or AutoAWQ checkpoint through read_gptq / read_awq. The input is
// config.json's text, then (after the first NUL byte, when there is one) a few bytes that shape
// one module's tensors: dims of qweight, qzeros, scales and g_idx, their dtypes, which are
// present, and the words' content (often the symmetric zeros, so that reading goes past them).
// Any exception other than qforge::Error, any crash or sanitizer report, or an accepted
// checkpoint whose records do not hold (Graph::check_quant_records) is a bug.
// Seeds: tests/fuzz/corpus/gptq_awq (the configs qforge's writers emit, with shapes).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "importers/quantized_checkpoint/gptq_awq_reader.h"
#include "ir/error.h"

#include "abort_on_internal.h"

namespace {

const std::string kModule = "model.layers.0.mlp.down_proj";

struct Bytes {
  const uint8_t* p;
  size_t n;
  size_t i = 0;
  uint8_t next() { return n == 0 ? 0 : p[i++ % n]; }
};

qforge::DType pick_dtype(uint8_t b) {
  using qforge::DType;
  constexpr DType kinds[] = {DType::I32, DType::F16, DType::F32, DType::BF16, DType::I64};
  return kinds[b % 5];
}

qforge::Tensor filled(qforge::DType dtype, qforge::Shape shape, Bytes& b, uint8_t fill) {
  qforge::Tensor t(dtype, std::move(shape));
  for (auto& x : t.mutable_bytes()) x = static_cast<std::byte>(fill ? fill : b.next());
  return t;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto* nul = static_cast<const uint8_t*>(std::memchr(data, 0, size));
  const size_t config_size = nul == nullptr ? size : static_cast<size_t>(nul - data);
  const std::string config(reinterpret_cast<const char*>(data), config_size);
  Bytes b{nul == nullptr ? nullptr : nul + 1, nul == nullptr ? 0 : size - config_size - 1};
  const uint8_t flags = b.next();
  const int64_t r0 = b.next() % 9, c0 = b.next() % 9, g = b.next() % 5, zc = b.next() % 5;
  const int64_t k = b.next() % 70;
  // Zero words that hold the symmetric zero in either convention, or fuzzed bytes.
  const uint8_t zero_fill = (flags & 1) ? 0x88 : (flags & 2) ? 0x77 : 0;
  qforge::Graph graph;
  graph.set_initializer(kModule + ".qweight",
                        filled(pick_dtype(flags & 4 ? b.next() : 0), {r0, c0}, b, 0));
  if (!(flags & 8)) {
    graph.set_initializer(kModule + ".qzeros", filled(qforge::DType::I32, {g, zc}, b, zero_fill));
  }
  if (!(flags & 16)) {
    graph.set_initializer(kModule + ".scales",
                          filled(pick_dtype(1 + b.next() % 3), {g, b.next() % 70}, b, 0x3c));
  }
  if (flags & 32) graph.set_initializer(kModule + ".g_idx", filled(qforge::DType::I32, {k}, b, 0));
  if (flags & 64) graph.set_initializer(kModule + ".weight", filled(qforge::DType::F16, {1}, b, 0));
  try {
    if (flags & 128) {
      qforge::read_awq(config, "fuzz/config.json", graph);
    } else {
      qforge::read_gptq(config, "fuzz/config.json", graph);
    }
    graph.check_quant_records();
  } catch (const qforge::Error& e) {
    qforge::fuzz::abort_on_internal(e);
  }
  return 0;
}
