// The runtime's two f32 products with a constant weight, C[M, N] = A[M, K] @ W[K, N]:
// - Sgemm: kernels/gemm.h, fixed tiles of single-threaded cblas_sgemm, each call packing its
//   part of W again (the path of a weight the executor did not pack);
// - Packed: kernels/packed_gemm.h on W packed once, as the executor does for MatMul and Gemm,
//   with the widest kernel the CPU runs (AVX-512 where it has it); PackedAvx2: the AVX2 kernel.
//
// The weights cycle through copies that add up to at least 64 MiB, so each product reads its
// weight from memory, as a model's layers do (MiniLM's 42 MB of projections do not fit this
// machine's 32 MiB L3). Counter: GFLOP/s (2 M N K per product).
//
// Shapes: MiniLM at batch 2 x 16 tokens (its QKV/output, FFN up and down), a decoder layer at
// 512 tokens (TinyLlama-1.1B's projections) and the same weights at 1 and 8 rows (decoding).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <utility>
#include <random>
#include <vector>

#include "kernels/gemm.h"
#include "kernels/packed_gemm.h"

namespace {

struct Problem {
  int64_t m, k, n;
  std::vector<float> a;
  std::vector<std::vector<float>> w;
  std::vector<qforge::PackedMatrix> packed;
  std::vector<float> c;

  Problem(int64_t m_, int64_t k_, int64_t n_) : m(m_), k(k_), n(n_) {
    std::mt19937 rng(7);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    a.resize(static_cast<size_t>(m * k));
    for (float& v : a) v = dist(rng);
    const int64_t bytes = k * n * 4;
    const int64_t copies = std::max<int64_t>(1, ((int64_t{64} << 20) + bytes - 1) / bytes);
    for (int64_t i = 0; i < copies; ++i) {
      std::vector<float> wi(static_cast<size_t>(k * n));
      for (float& v : wi) v = dist(rng);
      if (qforge::packed_gemm_supported()) packed.emplace_back(wi.data(), k, n, n, false);
      w.push_back(std::move(wi));
    }
    c.resize(static_cast<size_t>(m * n));
  }
};

Problem& problem(int64_t m, int64_t k, int64_t n) {
  static std::vector<std::unique_ptr<Problem>> all;
  for (auto& p : all) {
    if (p->m == m && p->k == k && p->n == n) return *p;
  }
  all.push_back(std::make_unique<Problem>(m, k, n));
  return *all.back();
}

void flops(benchmark::State& state, const Problem& p) {
  state.counters["GFLOP/s"] = benchmark::Counter(
      2.0 * double(p.m) * double(p.n) * double(p.k) * double(state.iterations()) * 1e-9,
      benchmark::Counter::kIsRate);
}

void BM_Sgemm(benchmark::State& state) {
  Problem& p = problem(state.range(0), state.range(1), state.range(2));
  const int threads = static_cast<int>(state.range(3));
  const qforge::GemmShape s{.m = p.m, .n = p.n, .k = p.k, .lda = p.k, .ldb = p.n, .ldc = p.n};
  size_t i = 0;
  for (auto _ : state) {
    qforge::gemm_f32(threads, s, p.a.data(), p.w[i].data(), p.c.data());
    i = (i + 1) % p.w.size();
    benchmark::DoNotOptimize(p.c.data());
  }
  flops(state, p);
}

void packed(benchmark::State& state, bool avx2_only) {
  if (!qforge::packed_gemm_supported()) {
    state.SkipWithError("this CPU lacks AVX2/FMA, the packed kernel's");
    return;
  }
  Problem& p = problem(state.range(0), state.range(1), state.range(2));
  const int threads = static_cast<int>(state.range(3));
  qforge::packed_gemm_use_avx2_only(avx2_only);
  size_t i = 0;
  for (auto _ : state) {
    qforge::gemm_f32_packed(threads, p.m, p.a.data(), p.k, p.packed[i], p.c.data(), p.n, false);
    i = (i + 1) % p.packed.size();
    benchmark::DoNotOptimize(p.c.data());
  }
  qforge::packed_gemm_use_avx2_only(false);
  flops(state, p);
}

// The widest kernel the CPU runs (AVX-512 where it has it), and the AVX2 kernel on the same CPU.
void BM_Packed(benchmark::State& state) { packed(state, false); }
void BM_PackedAvx2(benchmark::State& state) { packed(state, true); }

}  // namespace

// Each shape's two products are registered one after the other, so they run close in time on a
// machine whose speed drifts.
int main(int argc, char** argv) {
  for (const int threads : {1, 2}) {
    for (const auto& s : std::vector<std::vector<int64_t>>{{32, 384, 384},
                                                          {32, 384, 1536},
                                                          {32, 1536, 384},
                                                          {1, 2048, 2048},
                                                          {8, 2048, 5632},
                                                          {512, 2048, 2048},
                                                          {512, 2048, 5632},
                                                          {512, 5632, 2048}}) {
      using Fn = void (*)(benchmark::State&);
      for (const auto& [name, fn] : {std::pair<const char*, Fn>{"BM_Sgemm", BM_Sgemm},
                                     std::pair<const char*, Fn>{"BM_Packed", BM_Packed},
                                     std::pair<const char*, Fn>{"BM_PackedAvx2",
                                                                BM_PackedAvx2}}) {
        benchmark::RegisterBenchmark(name, fn)
            ->ArgNames({"m", "k", "n", "threads"})
            ->Args({s[0], s[1], s[2], threads})
            ->UseRealTime()
            ->Unit(benchmark::kMillisecond);
      }
    }
  }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
