#pragma once
// Weight-only symmetric INT8: constant weights of Conv, ConvTranspose, Gemm and MatMul become
// int8 initializers with a DequantizeLinear in front of the op, each described by a
// quantized-tensor record on the graph (ir/quant_record.h).
#include <memory>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include "ir/pass.h"
#include "kernels/device.h"

namespace qforge {

struct WeightInt8Options {
  bool per_tensor = false;                 // default per-channel on the output channel
  std::optional<std::regex> exclude;       // node names matching are left float
  std::string exclude_pattern;             // the text of `exclude`, for reports
  std::vector<std::string> op_types;       // empty = Conv, ConvTranspose, Gemm, MatMul
  Device device = Device::Auto;
};

std::unique_ptr<Pass> make_weight_int8_pass(WeightInt8Options options);

}  // namespace qforge
