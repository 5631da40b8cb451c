#pragma once
// The command-line values that name a library choice: each parser turns a flag's text into the
// library's enum or struct, or throws Error(Usage) naming the flag and the choices. They live in
// cli/ so that the layers below never parse flags; config files (cli/job/) use them too.
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kernels/device.h"
#include "kernels/int4.h"
#include "quant/schemes.h"
#include "quant/static/static_int8.h"
#include "quant/w4a16/w4a16.h"
#include "runtime/executor.h"

namespace qforge {

// --device: "auto" | "cpu" | "cuda".
Device parse_device(std::string_view name);
// --w4-scale: "mse" | "amax".
Int4Scale parse_int4_scale(std::string_view name);
// --int4-format: "onnx-blocked" (or "onnx") | "matmulnbits".
Int4Format parse_int4_format(std::string_view name);
// --w4-method: "rtn" | "awq" | "gptq".
W4Method parse_w4_method(std::string_view name);
// --keep-fp32: comma-separated op types; "default" expands to default_keep_fp32_ops(), "none"
// keeps nothing. Throws Usage for an empty entry.
std::vector<std::string> parse_keep_fp32(const std::string& text);
// --quant: a name of kQuantSchemes; nullopt for anything else.
std::optional<QuantScheme> parse_quant_scheme(std::string_view name);
// One --override value: NAME=amax:X (X > 0) or NAME=per-tensor.
std::pair<std::string, TensorOverride> parse_tensor_override(std::string_view text);
// --half-compute: "auto", "ort", "per-op"; nullopt for anything else.
std::optional<HalfCompute> parse_half_compute(std::string_view text);

}  // namespace qforge
