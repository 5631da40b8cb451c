#include "quant/static/static_int8_tensors.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "ir/error.h"
#include "kernels/quantize.h"
#include "quant/weights/channel_view.h"
#include "quant/weights/f32_values.h"

namespace qforge {

namespace {

Node make_node(UniqueNames& names, const std::string& op, const std::string& base,
               std::vector<std::string> inputs, const std::string& output_hint) {
  Node n;
  n.op_type = op;
  n.name = names.take(base + "_" + op);
  n.inputs = std::move(inputs);
  n.outputs = {names.take(output_hint)};
  return n;
}

}  // namespace

QuantizedWeight quantize_weight(const Tensor& weight, const std::string& weight_name,
                                std::optional<int64_t> axis, std::optional<float> amax,
                                Device device, KernelWorkspace& workspace) {
  const F32Values f32(weight);
  const std::span<const float> values = f32.span();
  QuantizedWeight out;
  out.axis = amax ? std::nullopt : axis;
  const ChannelView v = channel_view(weight.shape(), out.axis);
  std::vector<float> amaxes(static_cast<size_t>(v.channels));
  if (amax) {
    amaxes[0] = *amax;
  } else {
    amax_per_channel(values, v.outer, v.channels, v.inner, amaxes, device, &workspace);
  }
  for (size_t c = 0; c < amaxes.size(); ++c) {
    if (!std::isfinite(amaxes[c]) || amaxes[c] < 0.0f) {
      fail_invalid("static-int8: weight '" + weight_name + "' holds NaN or Inf" +
                   (out.axis ? " in channel " + std::to_string(c) : std::string()) +
                   ": fix the model, or leave its node float with --exclude");
    }
  }
  out.scales.resize(amaxes.size());
  std::transform(amaxes.begin(), amaxes.end(), out.scales.begin(), int8_symmetric_scale);
  out.values = Tensor(DType::I8, weight.shape());
  quantize_int8(values, v.outer, v.channels, v.inner, out.scales, out.values.mutable_data<int8_t>(),
                device, &workspace);
  std::vector<float> dequantized(values.size());
  dequantize_int8(out.values.data<int8_t>(), v.outer, v.channels, v.inner, out.scales, dequantized,
                  device, &workspace);
  out.error = measure_quant_error(values, dequantized);
  return out;
}

std::optional<QuantizedBias> quantize_bias_int32(std::span<const float> bias, float input_scale,
                                                 std::span<const float> weight_scales,
                                                 double& max_ratio) {
  constexpr double kLimit = std::numeric_limits<int32_t>::max();
  QuantizedBias out;
  out.values = Tensor(DType::I32, {static_cast<int64_t>(bias.size())});
  out.scales.resize(bias.size());
  auto q = out.values.mutable_data<int32_t>();
  max_ratio = 0.0;
  bool fits = true;
  for (size_t c = 0; c < bias.size(); ++c) {
    // float32 product, as the DequantizeLinear scale initializer will hold it.
    const float scale = input_scale * weight_scales[c % weight_scales.size()];
    out.scales[c] = scale;
    const double ratio = scale > 0.0f ? static_cast<double>(bias[c]) / scale
                                      : std::numeric_limits<double>::infinity();
    max_ratio = std::max(max_ratio, std::fabs(ratio));
    if (!(std::fabs(ratio) <= kLimit)) {  // also catches NaN
      fits = false;
      continue;
    }
    q[c] = static_cast<int32_t>(std::nearbyint(ratio));
  }
  if (!fits) return std::nullopt;
  return out;
}

std::string add_dequantize(Graph& graph, UniqueNames& names, const std::string& base,
                           const std::string& quantized,
                           std::span<const float> scales, DType zero_point_dtype,
                           std::optional<int64_t> axis) {
  const Shape shape = axis ? Shape{static_cast<int64_t>(scales.size())} : Shape{};
  const std::string scale_name = names.take(base + "_scale");
  graph.set_initializer(scale_name, Tensor::from_f32(scales, shape));
  const std::string zp_name = names.take(base + "_zero_point");
  graph.set_initializer(zp_name, Tensor(zero_point_dtype, shape));  // zero-filled: symmetric
  Node dq = make_node(names, "DequantizeLinear", base, {quantized, scale_name, zp_name},
                      base + "_dequantized");
  if (axis) dq.set_attr(Attribute::make_int("axis", *axis));
  std::string result = dq.outputs[0];
  graph.add_quant_record({.kind = QuantKind::Weight,
                          .name = quantized,
                          .source = base,
                          .dtype = zero_point_dtype,
                          .bits = dtype_bits(zero_point_dtype),
                          .axis = axis,
                          .scale = scale_name,
                          .zero_point = zp_name,
                          .reader = result});
  graph.nodes.push_back(std::move(dq));
  return result;
}

std::string add_quantize_dequantize(Graph& graph, UniqueNames& names, const std::string& activation,
                                    float scale) {
  const std::string scale_name = names.take(activation + "_scale");
  graph.set_initializer(scale_name, Tensor::from_f32(std::span<const float>(&scale, 1), {}));
  const std::string zp_name = names.take(activation + "_zero_point");
  graph.set_initializer(zp_name, Tensor(DType::I8, {}));
  Node q = make_node(names, "QuantizeLinear", activation, {activation, scale_name, zp_name},
                     activation + "_quantized");
  const std::string quantized = q.outputs[0];
  graph.nodes.push_back(std::move(q));
  Node dq = make_node(names, "DequantizeLinear", activation, {quantized, scale_name, zp_name},
                      activation + "_dequantized");
  std::string result = dq.outputs[0];
  graph.add_quant_record({.kind = QuantKind::Activation,
                          .name = quantized,
                          .source = activation,
                          .dtype = DType::I8,
                          .bits = 8,
                          .scale = scale_name,
                          .zero_point = zp_name,
                          .reader = result});
  graph.nodes.push_back(std::move(dq));
  return result;
}

}  // namespace qforge
