#include "importers/quantized_checkpoint/modelopt_int4.h"

#include <bit>
#include <cmath>
#include <cstring>

#include "ir/error.h"

namespace qforge {

std::vector<int8_t> unpack_int4_row_pairs(std::span<const uint8_t> bytes, int64_t rows,
                                          int64_t k) {
  if (rows % 2 != 0 || static_cast<int64_t>(bytes.size()) != rows / 2 * k) {
    fail_internal("unpack_int4_row_pairs: " + std::to_string(bytes.size()) + " bytes for " +
                  std::to_string(rows) + " x " + std::to_string(k));
  }
  std::vector<int8_t> q(static_cast<size_t>(rows * k));
  const auto nibble = [](uint32_t v) { return static_cast<int8_t>(v >= 8 ? int(v) - 16 : int(v)); };
  for (int64_t i = 0; i < rows / 2; ++i) {
    for (int64_t c = 0; c < k; ++c) {
      const uint8_t b = bytes[static_cast<size_t>(i * k + c)];
      q[static_cast<size_t>((2 * i) * k + c)] = nibble(b & 0x0fu);
      q[static_cast<size_t>((2 * i + 1) * k + c)] = nibble(b >> 4);
    }
  }
  return q;
}

Tensor linear_values_tensor(std::span<const int8_t> q, int bits, int64_t n, int64_t k) {
  if (static_cast<int64_t>(q.size()) != n * k || (bits != 4 && bits != 8)) {
    fail_internal("linear_values_tensor: " + std::to_string(q.size()) + " values for " +
                  std::to_string(n) + " x " + std::to_string(k));
  }
  Tensor values(bits == 4 ? DType::I4 : DType::I8, {n, k});
  auto out = values.mutable_data<uint8_t>();
  if (bits == 8) {
    std::memcpy(out.data(), q.data(), q.size());
    return values;
  }
  for (size_t e = 0; e < q.size(); ++e) {
    out[e / 2] |= static_cast<uint8_t>((static_cast<uint8_t>(q[e]) & 0x0fu) << (4 * (e % 2)));
  }
  return values;
}

namespace {

// `values` exactly representable in `dtype`: the tensor, else nullopt.
std::optional<Tensor> exactly(const std::vector<float>& values, const Shape& shape, DType dtype) {
  Tensor t = Tensor::from_f32(values, shape, dtype);
  const std::vector<float> back = t.to_f32();
  for (size_t i = 0; i < values.size(); ++i) {
    if (std::bit_cast<uint32_t>(back[i]) != std::bit_cast<uint32_t>(values[i])) {
      return std::nullopt;
    }
  }
  return t;
}

}  // namespace

Tensor fold_pre_quant_scale(const Tensor& scale, int64_t block, int64_t k, const Tensor& pqs,
                            const std::string& pqs_name, const std::string& where) {
  if (!dtype_is_float(pqs.dtype()) || pqs.shape() != Shape{k}) {
    fail_invalid(where + "tensor '" + pqs_name + "' is " + std::string(dtype_name(pqs.dtype())) +
                 " " + shape_to_string(pqs.shape()) + ", expected a float [" + std::to_string(k) +
                 "] (one pre-quant scale per input feature)");
  }
  const std::vector<float> s = pqs.to_f32();
  bool ones = true;
  for (const float v : s) ones = ones && v == 1.0f;
  if (ones) return scale;
  const int64_t g = block > 0 ? block : k;
  const std::string why =
      ": the engine computes (x * pre_quant_scale) @ (q * weight_scale)^T, which integers with "
      "one scale per group of " + std::to_string(g) + " inputs hold only when pre_quant_scale is "
      "one value over each group; qforge reads pre-quant scales that are all ones (qforge's own "
      "export, or ModelOpt's with them folded into the preceding norm or Linear) or constant per "
      "group: quantize the float model again";
  for (int64_t c = 0; c < k; ++c) {
    const float first = s[static_cast<size_t>(c / g * g)];
    const float v = s[static_cast<size_t>(c)];
    if (!std::isfinite(v) || std::bit_cast<uint32_t>(v) != std::bit_cast<uint32_t>(first)) {
      fail_unsupported(where + "'" + pqs_name + "' is not all ones and [" + std::to_string(c) +
                       "] = " + std::to_string(v) + " differs from [" +
                       std::to_string(c / g * g) + "] = " + std::to_string(first) + why);
    }
  }
  const std::vector<float> w = scale.to_f32();
  const int64_t groups = k / g;
  std::vector<float> folded(w.size());
  for (size_t i = 0; i < w.size(); ++i) {
    const float sj = s[static_cast<size_t>(static_cast<int64_t>(i) % groups * g)];
    const double product = static_cast<double>(w[i]) * static_cast<double>(sj);
    folded[i] = static_cast<float>(product);
    if (static_cast<double>(folded[i]) != product || !std::isfinite(folded[i])) {
      fail_unsupported(where + "'" + pqs_name + "' folded into the group scales is not exact in "
                       "float32 (scale " + std::to_string(w[i]) + " times " +
                       std::to_string(sj) + ")" + why);
    }
  }
  if (auto t = exactly(folded, scale.shape(), scale.dtype())) return *t;
  return Tensor::from_f32(folded, scale.shape(), DType::F32);
}

Tensor narrow_scale(const Tensor& scale, std::optional<DType> dtype) {
  if (!dtype || *dtype == scale.dtype() || !dtype_is_float(scale.dtype()) ||
      (*dtype != DType::F16 && *dtype != DType::BF16 && *dtype != DType::F32)) {
    return scale;
  }
  if (auto t = exactly(scale.to_f32(), scale.shape(), *dtype)) return *t;
  return scale;
}

bool module_pattern_match(std::string_view p, std::string_view s) {
  // Iterative glob with backtracking to the last '*'.
  size_t pi = 0, si = 0, star = std::string_view::npos, mark = 0;
  const auto set_match = [&](size_t& at, char c) {  // p[at] == '['; advances at past ']'
    size_t j = at + 1;
    const bool negate = j < p.size() && p[j] == '!';
    if (negate) ++j;
    bool hit = false;
    bool first = true;
    for (; j < p.size() && (first || p[j] != ']'); ++j, first = false) {
      if (j + 2 < p.size() && p[j + 1] == '-' && p[j + 2] != ']') {
        hit = hit || (p[j] <= c && c <= p[j + 2]);
        j += 2;
      } else {
        hit = hit || p[j] == c;
      }
    }
    if (j >= p.size()) return std::optional<bool>();  // no closing ']': a literal '['
    at = j + 1;
    return std::optional<bool>(hit != negate);
  };
  while (si < s.size()) {
    if (pi < p.size() && p[pi] == '*') {
      star = pi++;
      mark = si;
      continue;
    }
    if (pi < p.size()) {
      if (p[pi] == '?') {
        ++pi;
        ++si;
        continue;
      }
      if (p[pi] == '[') {
        size_t at = pi;
        const std::optional<bool> m = set_match(at, s[si]);
        if (m && *m) {
          pi = at;
          ++si;
          continue;
        }
        if (!m && s[si] == '[') {
          ++pi;
          ++si;
          continue;
        }
      } else if (p[pi] == s[si]) {
        ++pi;
        ++si;
        continue;
      }
    }
    if (star == std::string_view::npos) return false;
    pi = star + 1;
    si = ++mark;
  }
  while (pi < p.size() && p[pi] == '*') ++pi;
  return pi == p.size();
}

}  // namespace qforge
