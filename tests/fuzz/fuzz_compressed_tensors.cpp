// libFuzzer target: a compressed-tensors checkpoint through read_compressed_tensors. The input is
// config.json's text, then (after the first NUL byte, when there is one) a few bytes that shape
// one module's tensors: dims of weight_packed, weight_scale and weight_shape, their dtypes,
// which side tensors are present, and the words' content. Any exception other than
// qforge::Error, any crash or sanitizer report, or an accepted checkpoint whose records do not
// hold (Graph::check_quant_records; store_quantized_linear's Internal on a scale that does not
// fit) is a bug.
// Seeds: tests/fuzz/corpus/compressed_tensors (the configs qforge's writer emits, with shapes).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "importers/quantized_checkpoint/compressed_tensors_reader.h"
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
  constexpr DType kinds[] = {DType::I32,  DType::F32, DType::F16,
                             DType::BF16, DType::I64, DType::I8};
  return kinds[b % 6];
}

qforge::Tensor filled(qforge::DType dtype, qforge::Shape shape, Bytes& b) {
  qforge::Tensor t(dtype, std::move(shape));
  for (auto& x : t.mutable_bytes()) x = static_cast<std::byte>(b.next());
  return t;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto* nul = static_cast<const uint8_t*>(std::memchr(data, 0, size));
  const size_t config_size = nul == nullptr ? size : static_cast<size_t>(nul - data);
  const std::string config(reinterpret_cast<const char*>(data), config_size);
  Bytes b{nul == nullptr ? nullptr : nul + 1, nul == nullptr ? 0 : size - config_size - 1};
  const uint8_t flags = b.next();
  const int64_t n = b.next() % 9, words = b.next() % 17, scale_cols = b.next() % 9;
  const int64_t shape_n = b.next() % 9 - 1, shape_k = b.next() % 130 - 1;
  qforge::Graph g;
  g.set_initializer(kModule + ".weight_packed",
                    filled(pick_dtype(flags & 1 ? 4 : 0), {n, words}, b));
  if (!(flags & 2)) {
    g.set_initializer(kModule + ".weight_scale",
                      filled(pick_dtype(1 + (b.next() % 3)), {n, scale_cols}, b));
  }
  if (!(flags & 4)) {
    qforge::Tensor shape(qforge::DType::I64, {2});
    shape.mutable_data<int64_t>()[0] = shape_n;
    shape.mutable_data<int64_t>()[1] = shape_k;
    g.set_initializer(kModule + ".weight_shape", shape);
  }
  if (flags & 8) {
    g.set_initializer(kModule + ".weight_zero_point", filled(qforge::DType::I32, {1, 1}, b));
  }
  if (flags & 16) {
    g.set_initializer("model.layers.1.mlp.up_proj.weight_scale",
                      filled(qforge::DType::F32, {1}, b));
  }
  try {
    qforge::read_compressed_tensors(config, "fuzz/config.json", g);
    g.check_quant_records();
  } catch (const qforge::Error& e) {
    qforge::fuzz::abort_on_internal(e);
  }
  return 0;
}
