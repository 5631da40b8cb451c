#pragma once
// Helpers for the LoRA tests: seeded random tensors, adapters built through the real PEFT key
// path, and a plain scalar reference of PEFT's merge formulas.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "importers/lora/lora_adapter.h"
#include "ir/error.h"
#include "ir/graph.h"

namespace qforge::lora_test {

inline std::vector<float> random_values(size_t n, uint32_t seed, float lo = -1.0f,
                                        float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

inline Tensor random_tensor(Shape shape, uint32_t seed, DType dtype = DType::F32, float lo = -1.0f,
                            float hi = 1.0f) {
  const auto n = static_cast<size_t>(shape_numel(shape));
  return Tensor::from_f32(random_values(n, seed, lo, hi), std::move(shape), dtype);
}

// adapter_config.json text for a LORA adapter with extra fields spliced in.
inline std::string config_json(int r, double alpha, const std::string& extra = "") {
  return std::string("{\"peft_type\": \"LORA\", \"r\": ") + std::to_string(r) +
         ", \"lora_alpha\": " + std::to_string(alpha) + (extra.empty() ? "" : ", " + extra) + "}";
}

inline LoraAdapter peft_adapter(const std::string& config, const Graph& weights,
                                const std::string& name = "test") {
  LoraAdapter a = build_peft_adapter(parse_lora_config(config, "adapter_config.json"), weights,
                                     "adapter_model.safetensors");
  a.name = name;
  return a;
}

// Plain loops, float arithmetic in PEFT's order: delta[o][i] = (sum_k B[o][k] A[k][i]) * s.
inline std::vector<float> ref_delta(const std::vector<float>& a, const std::vector<float>& b,
                                    int64_t out, int64_t in, int64_t r, float s) {
  std::vector<float> d(static_cast<size_t>(out * in));
  for (int64_t o = 0; o < out; ++o) {
    for (int64_t i = 0; i < in; ++i) {
      float acc = 0.0f;
      for (int64_t k = 0; k < r; ++k) acc += b[o * r + k] * a[k * in + i];
      d[o * in + i] = acc * s;
    }
  }
  return d;
}

inline std::vector<float> ref_transpose(const std::vector<float>& v, int64_t rows, int64_t cols) {
  std::vector<float> t(v.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) t[c * rows + r] = v[r * cols + c];
  return t;
}

// DoRA on canonical [out, in] arrays: w0 for the norm, w the current weight.
inline std::vector<float> ref_dora(const std::vector<float>& w0, const std::vector<float>& w,
                                   const std::vector<float>& delta, const std::vector<float>& mag,
                                   int64_t out, int64_t in) {
  std::vector<float> res(w.size());
  for (int64_t o = 0; o < out; ++o) {
    double ss = 0.0;
    for (int64_t i = 0; i < in; ++i) {
      const float v = w0[o * in + i] + delta[o * in + i];
      ss += double(v) * v;
    }
    const float f = mag[o] / static_cast<float>(std::sqrt(ss));
    for (int64_t i = 0; i < in; ++i) res[o * in + i] = f * (w[o * in + i] + delta[o * in + i]);
  }
  return res;
}

inline void expect_near_all(const std::vector<float>& got, const std::vector<float>& want,
                            float tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  float worst = 0.0f;
  size_t at = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const float d = std::fabs(got[i] - want[i]);
    if (!(d <= worst)) {
      worst = d;
      at = i;
    }
  }
  EXPECT_LE(worst, tol) << what << ": worst difference at element " << at << " (got " << got[at]
                        << ", want " << want[at] << ")";
}

// Runs `fn`, expects an Error of `category` whose message contains every needle.
template <typename Fn>
void expect_error(Fn&& fn, ErrorCategory category, const std::vector<std::string>& needles) {
  try {
    fn();
    ADD_FAILURE() << "expected an error of category " << category_name(category);
  } catch (const Error& e) {
    EXPECT_EQ(e.category(), category) << e.what();
    for (const auto& n : needles)
      EXPECT_NE(std::string(e.what()).find(n), std::string::npos)
          << "'" << n << "' not in: " << e.what();
  }
}

}  // namespace qforge::lora_test
