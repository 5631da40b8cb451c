#pragma once
// The PEFT fixtures of tests/interop/fixtures/make_peft_adapters.py, generated once per test
// process with $QFORGE_PYTHON into a temporary folder (or read from $QFORGE_PEFT_FIXTURES when
// that folder already holds a manifest.json), and the comparisons the interop tests share.
#include <gtest/gtest.h>

#include <unistd.h>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "ir/graph.h"
#include "ir/half.h"

namespace qforge::lora_test {

struct PeftFixtures {
  std::filesystem::path dir;
  nlohmann::json manifest;
  std::string skip;   // why the suite cannot run here
  std::string error;  // why generation failed
  std::string python;
};

inline const PeftFixtures& peft_fixtures() {
  static const PeftFixtures fixtures = [] {
    PeftFixtures f;
    const char* python = std::getenv("QFORGE_PYTHON");
    if (python == nullptr || *python == '\0') {
      f.skip =
          "QFORGE_PYTHON not set: point it at a Python with torch, peft 0.21, transformers, "
          "safetensors and onnxruntime to compare merges with PEFT";
      return f;
    }
    f.python = python;
    const char* cached = std::getenv("QFORGE_PEFT_FIXTURES");
    f.dir = cached ? std::filesystem::path(cached)
                   : std::filesystem::temp_directory_path() /
                         ("qforge_peft_fixtures_" + std::to_string(::getpid()));
    if (!std::filesystem::exists(f.dir / "manifest.json")) {
      const std::string script =
          std::string(QFORGE_SOURCE_DIR) + "/tests/interop/fixtures/make_peft_adapters.py";
      const std::string log = f.dir.string() + ".log";
      const std::string cmd = "\"" + f.python + "\" \"" + script + "\" \"" + f.dir.string() +
                              "\" > \"" + log + "\" 2>&1";
      if (const int rc = std::system(cmd.c_str()); rc != 0) {
        f.error = "fixture script failed (status " + std::to_string(rc) + "); see " + log;
        return f;
      }
    }
    std::ifstream in(f.dir / "manifest.json");
    f.manifest = nlohmann::json::parse(in, nullptr, false);
    if (f.manifest.is_discarded()) f.error = "cannot parse " + (f.dir / "manifest.json").string();
    if (!cached) {
      static const std::filesystem::path cleanup = f.dir;
      std::atexit([] {
        std::error_code ec;
        std::filesystem::remove_all(cleanup, ec);
        std::filesystem::remove(cleanup.string() + ".log", ec);
      });
    }
    return f;
  }();
  return fixtures;
}

// Skips (no Python) or fails (generation failed) the calling test.
#define QFORGE_REQUIRE_PEFT_FIXTURES()                      \
  do {                                                      \
    const auto& fx_ = ::qforge::lora_test::peft_fixtures(); \
    if (!fx_.skip.empty()) GTEST_SKIP() << fx_.skip;        \
    ASSERT_TRUE(fx_.error.empty()) << fx_.error;            \
  } while (0)

// Distance in units in the last place between two f16 or bf16 bit patterns.
inline int ulp_distance16(uint16_t a, uint16_t b) {
  auto ordered = [](uint16_t u) {
    return (u & 0x8000) ? -static_cast<int>(u & 0x7fff) : static_cast<int>(u);
  };
  return std::abs(ordered(a) - ordered(b));
}

struct Worst {
  double value = 0.0;  // f32: max abs difference; f16/bf16: max ulp distance
  std::string tensor;
  int changed = 0;  // tensors the merge changed with respect to the base
};

// Compares every tensor of `ours` with `peft` (same names, dtypes, shapes), counting the tensors
// that differ from `base`.
inline Worst compare_state_dicts(const Graph& ours, const Graph& peft, const Graph& base) {
  Worst w;
  EXPECT_EQ(ours.initializers().size(), peft.initializers().size());
  for (const auto& [name, want] : peft.initializers()) {
    const Tensor* got = ours.find_initializer(name);
    if (got == nullptr) {
      ADD_FAILURE() << "qforge's merge lacks '" << name << "'";
      continue;
    }
    EXPECT_EQ(got->dtype(), want.dtype()) << name;
    EXPECT_EQ(got->shape(), want.shape()) << name;
    if (got->dtype() != want.dtype() || got->shape() != want.shape()) continue;
    if (const Tensor* b = base.find_initializer(name); b == nullptr || !b->equals(want))
      ++w.changed;
    double d = 0.0;
    if (want.dtype() == DType::F16 || want.dtype() == DType::BF16) {
      const auto g = got->data<uint16_t>();
      const auto p = want.data<uint16_t>();
      for (size_t i = 0; i < g.size(); ++i) d = std::max<double>(d, ulp_distance16(g[i], p[i]));
    } else {
      const auto g = got->to_f32();
      const auto p = want.to_f32();
      for (size_t i = 0; i < g.size(); ++i)
        d = std::max<double>(d, std::fabs(double(g[i]) - double(p[i])));
    }
    if (w.tensor.empty() || d > w.value) {
      w.value = d;
      w.tensor = name;
    }
  }
  return w;
}

}  // namespace qforge::lora_test
