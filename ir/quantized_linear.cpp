#include "ir/quantized_linear.h"

#include <utility>
#include <vector>

#include "ir/error.h"

namespace qforge {

std::string quantized_linear_scale_name(std::string_view weight) {
  return std::string(weight) + "_scale";
}

void store_quantized_linear(Graph& graph, const std::string& weight, Tensor values, Tensor scale,
                            int64_t block_size) {
  const std::string what = "quantized Linear '" + weight + "'";
  if (values.dtype() != DType::I4 && values.dtype() != DType::I8) {
    fail_internal(what + " holds " + std::string(dtype_name(values.dtype())) + ", not i4 or i8");
  }
  if (values.rank() != 2) fail_internal(what + " is not [out, in]");
  const int64_t out = values.shape()[0];
  const int64_t in = values.shape()[1];
  const bool blocked = block_size > 0;
  const bool fits =
      blocked ? (in % block_size == 0 && scale.rank() == 2 && scale.shape()[0] == out &&
                 scale.shape()[1] == in / block_size)
              : (scale.rank() == 1 && scale.shape()[0] == out);
  if (!fits) {
    fail_internal(what + ": scale " + shape_to_string(scale.shape()) + " does not fit " +
                  shape_to_string(values.shape()) + " with block size " +
                  std::to_string(block_size));
  }
  QuantRecord record;
  record.kind = QuantKind::Weight;
  record.name = weight;
  record.source = weight;
  record.dtype = values.dtype();
  record.bits = values.dtype() == DType::I4 ? 4 : 8;
  record.axis = blocked ? 1 : 0;
  record.block_size = blocked ? block_size : 0;
  record.scale = quantized_linear_scale_name(weight);
  graph.set_initializer(weight, std::move(values));
  graph.set_initializer(record.scale, std::move(scale));
  graph.add_quant_record(std::move(record));
}

Tensor dequantize_quantized_linear(const Graph& graph, const QuantRecord& r,
                                   std::optional<DType> dtype) {
  const Tensor* q = graph.find_initializer(r.name);
  const Tensor* scale = graph.find_initializer(r.scale);
  const std::string what = "quantized Linear '" + r.name + "'";
  if (q == nullptr || scale == nullptr || q->rank() != 2 || !r.reader.empty() ||
      (q->dtype() != DType::I4 && q->dtype() != DType::I8)) {
    fail_internal(what + " is not in the weights-only form");
  }
  const int64_t out = q->shape()[0], in = q->shape()[1];
  const int64_t block = r.block_size > 0 ? r.block_size : in;
  if (in % block != 0 || static_cast<int64_t>(scale->numel()) != out * (in / block)) {
    fail_internal(what + ": scale " + shape_to_string(scale->shape()) + " does not fit");
  }
  const std::vector<float> s = scale->to_f32();
  const auto bytes = q->data<uint8_t>();
  std::vector<float> w(static_cast<size_t>(out * in));
  for (int64_t row = 0; row < out; ++row) {
    for (int64_t col = 0; col < in; ++col) {
      const int64_t e = row * in + col;
      int v = 0;
      if (q->dtype() == DType::I4) {
        const int nib = (bytes[static_cast<size_t>(e / 2)] >> (4 * (e % 2))) & 0x0f;
        v = nib >= 8 ? nib - 16 : nib;
      } else {
        v = static_cast<int8_t>(bytes[static_cast<size_t>(e)]);
      }
      w[static_cast<size_t>(e)] =
          static_cast<float>(v) * s[static_cast<size_t>(row * (in / block) + col / block)];
    }
  }
  return Tensor::from_f32(w, {out, in}, dtype.value_or(scale->dtype()));
}

int64_t dequantize_quantized_linears(Graph& graph) {
  std::vector<QuantRecord> records;
  for (const QuantRecord& r : graph.quant_records()) {
    if (r.kind == QuantKind::Weight && r.reader.empty()) records.push_back(r);
  }
  for (const QuantRecord& r : records) {
    Tensor w = dequantize_quantized_linear(graph, r);
    graph.remove_initializer(r.scale);
    graph.remove_initializer(r.name);  // and its record
    graph.set_initializer(r.name, std::move(w));
  }
  return static_cast<int64_t>(records.size());
}

}  // namespace qforge
