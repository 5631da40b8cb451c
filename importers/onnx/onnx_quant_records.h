#pragma once
// The quantized-tensor records (ir/quant_record.h) of an ONNX graph that was quantized before
// qforge read it: the one place where records come from node patterns. import_onnx attaches
// them, so an already quantized model is described exactly as if a qforge pass had made it.
#include <vector>

#include "ir/graph.h"

namespace qforge {

// In node order, one record per stored tensor (the first node reading it wins):
// - DequantizeLinear (ONNX domain) of an initializer: a weight; of any other value: an
//   activation, whose source is the QuantizeLinear input that produced it. Axis from the node
//   (default 1, made non-negative against the weight's rank); per-tensor when the scale is a
//   scalar or not an initializer, unless block_size makes it blocked. dtype: the weight's; an
//   activation's is its zero point's, u8 without one (ONNX's default), unknown when the zero
//   point is computed.
// - com.microsoft MatMulNBits with an initializer B: a weight in MatMulNBits packing, axis 0 of
//   the logical [K, N], its bits and block_size attributes, u4 or u8 for 4 or 8 bits.
std::vector<QuantRecord> onnx_quant_records(const Graph& graph);

}  // namespace qforge
