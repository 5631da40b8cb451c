#include "cli/option_parsers.h"

#include <charconv>
#include <cmath>

#include "ir/error.h"
#include "quant/float16/float16_convert.h"

namespace qforge {

Device parse_device(std::string_view name) {
  if (name == "auto") return Device::Auto;
  if (name == "cpu") return Device::Cpu;
  if (name == "cuda") return Device::Cuda;
  fail_usage("--device '" + std::string(name) + "' is not a device: use auto, cpu or cuda");
}

Int4Scale parse_int4_scale(std::string_view name) {
  if (name == "mse") return Int4Scale::Mse;
  if (name == "amax") return Int4Scale::Amax;
  fail_usage("--w4-scale '" + std::string(name) +
             "' is not known; use mse (per-block scale search) or amax (scale = amax / 7)");
}

Int4Format parse_int4_format(std::string_view name) {
  if (name == "onnx-blocked" || name == "onnx") return Int4Format::OnnxBlocked;
  if (name == "matmulnbits") return Int4Format::MatMulNBits;
  fail_usage("--int4-format '" + std::string(name) +
             "' is not known; use onnx-blocked or matmulnbits");
}

W4Method parse_w4_method(std::string_view name) {
  if (name == "rtn") return W4Method::Rtn;
  if (name == "awq") return W4Method::Awq;
  if (name == "gptq") return W4Method::Gptq;
  fail_usage("--w4-method '" + std::string(name) + "' is not known; use rtn, awq or gptq");
}

std::vector<std::string> parse_keep_fp32(const std::string& text) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = std::min(text.find(',', start), text.size());
    const std::string item = text.substr(start, comma - start);
    if (item.empty()) {
      fail_usage("--keep-fp32 '" + text +
                 "' has an empty entry; give comma-separated op types (e.g. "
                 "default,Gelu), 'default' or 'none'");
    }
    if (item == "default") {
      for (auto& op : default_keep_fp32_ops()) out.push_back(std::move(op));
    } else if (item != "none") {
      out.push_back(item);
    }
    start = comma + 1;
  }
  return out;
}

std::optional<QuantScheme> parse_quant_scheme(std::string_view name) {
  for (const auto& info : kQuantSchemes) {
    if (info.name == name) return info.scheme;
  }
  return std::nullopt;
}

std::pair<std::string, TensorOverride> parse_tensor_override(std::string_view text) {
  const size_t eq = text.rfind('=');
  const std::string usage =
      "--override '" + std::string(text) + "': expected NAME=amax:X (X > 0) or NAME=per-tensor";
  if (eq == std::string_view::npos || eq == 0) fail_usage(usage);
  const std::string name(text.substr(0, eq));
  const std::string_view what = text.substr(eq + 1);
  TensorOverride o;
  if (what == "per-tensor") {
    o.per_tensor = true;
  } else if (what.starts_with("amax:")) {
    const std::string number(what.substr(5));
    float value = 0.0f;
    const auto [end, ec] = std::from_chars(number.data(), number.data() + number.size(), value);
    if (ec != std::errc() || end != number.data() + number.size() || !std::isfinite(value) ||
        value <= 0.0f) {
      fail_usage(usage);
    }
    o.amax = value;
  } else {
    fail_usage(usage);
  }
  return {name, o};
}

std::optional<HalfCompute> parse_half_compute(std::string_view text) {
  if (text == "auto") return HalfCompute::Auto;
  if (text == "ort") return HalfCompute::Ort;
  if (text == "per-op") return HalfCompute::PerOp;
  return std::nullopt;
}

}  // namespace qforge
