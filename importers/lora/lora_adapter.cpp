#include "importers/lora/lora_adapter.h"

#include <charconv>
#include <cmath>

#include "importers/lora/lora_module_check.h"
#include "ir/error.h"

namespace qforge {

namespace {

std::string describe(const LoraModule& m, const std::string& where) {
  return where + ": module '" + m.name + "'";
}

void check_float(const Tensor& t, const char* what, const LoraModule& m, const std::string& where) {
  if (!dtype_is_float(t.dtype())) {
    fail_invalid(describe(m, where) + " has " + what + " of dtype " +
                 std::string(dtype_name(t.dtype())) + "; LoRA factors must be floating point");
  }
}

void check_vector(const Tensor& t, const char* what, int64_t out, const LoraModule& m,
                  const std::string& where) {
  if (t.empty()) return;
  check_float(t, what, m, where);
  if (t.numel() != static_cast<uint64_t>(out)) {
    fail_invalid(describe(m, where) + " has " + what + " of shape " + shape_to_string(t.shape()) +
                 " but lora_B has " + std::to_string(out) + " output rows");
  }
}

}  // namespace

void check_lora_module(LoraModule& m, const std::string& where) {
  if (m.a.empty() || m.b.empty()) {
    fail_invalid(describe(m, where) + " has " +
                 (m.a.empty() ? "lora_B but no lora_A" : "lora_A but no lora_B") +
                 "; the adapter file is incomplete");
  }
  check_float(m.a, "lora_A", m, where);
  check_float(m.b, "lora_B", m, where);
  const Shape& a = m.a.shape();
  const Shape& b = m.b.shape();
  const std::string shapes =
      " (lora_A " + shape_to_string(a) + ", lora_B " + shape_to_string(b) + ")";
  if (a.size() < 2 || b.size() != a.size() || b[1] != a[0]) {
    fail_invalid(describe(m, where) + " has factors that do not multiply" + shapes);
  }
  if (m.kind == LoraLayerKind::Embedding) {
    if (a.size() != 2)
      fail_invalid(describe(m, where) + " has embedding factors of rank > 2" + shapes);
  } else {
    m.kind = a.size() == 2 ? LoraLayerKind::Linear : LoraLayerKind::Conv;
    for (size_t i = 2; i < b.size(); ++i) {
      if (b[i] != 1)
        fail_unsupported(describe(m, where) + " has a lora_B kernel larger than 1" + shapes);
    }
  }
  if (a[0] != m.r) {
    fail_invalid(describe(m, where) + " has rank " + std::to_string(a[0]) + shapes + " but " +
                 m.r_from + " gives r=" + std::to_string(m.r));
  }
  check_vector(m.magnitude, "lora_magnitude_vector", b[0], m, where);
  check_vector(m.bias, "lora_B.bias", b[0], m, where);
}

AdapterSpec parse_adapter_spec(std::string_view spec) {
  AdapterSpec out{std::filesystem::path(std::string(spec)), 1.0};
  const size_t colon = spec.rfind(':');
  if (colon == std::string_view::npos || colon == 0) return out;
  const std::string_view tail = spec.substr(colon + 1);
  double w = 0.0;
  const auto [end, ec] = std::from_chars(tail.data(), tail.data() + tail.size(), w);
  if (ec != std::errc() || end != tail.data() + tail.size() || tail.empty() || !std::isfinite(w)) {
    return out;
  }
  out.path = std::filesystem::path(std::string(spec.substr(0, colon)));
  out.weight = w;
  return out;
}

}  // namespace qforge
