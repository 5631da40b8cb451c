#include "ir/quantized_linear.h"

#include <utility>

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

}  // namespace qforge
