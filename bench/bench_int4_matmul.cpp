// W4A16 matmul: Y[M, N] = X[M, K] . dequant(W[K, N] int4, fp16 scales per block of 32 along K).
//
// CPU: qforge's int4_matmul (dequantizes per block into a small tile, f32 accumulation, OpenMP
// over tiles of N) against OpenBLAS sgemm on the already dequantized f32 weight (what the
// unfused runtime does after materialising the weight; the dequantization itself is not
// timed there) and against dequantize + sgemm (what the unfused runtime does on every run).
// Weight bytes: int4 + scales vs 4 per element.
//
// CUDA (registered only when a device answers; otherwise the program says so): the int4
// kernel on fp16 activations against cuBLAS fp16 GEMM (cublasGemmEx, f32 compute) on the fp16
// weight, device-resident buffers, timed with CUDA events. Counters: bytes moved (weight +
// activations + output) per second and that as a fraction of the device's peak memory
// bandwidth (memory clock and bus width from the device's attributes).
//
// Shapes: MiniLM's FFN (K 384, N 1536) and a Llama-like projection (K = N = 4096), M 1 and 16.
#include <benchmark/benchmark.h>
#include <cblas.h>

#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "ir/half.h"
#include "kernels/device.h"
#include "kernels/int4.h"
#include "kernels/int4_matmul.h"
#include "qforge/cublas_config.h"
#ifdef QFORGE_HAVE_CUDA
#include <cuda_runtime.h>

#include "kernels/cuda/int4_matmul_cuda.h"
#if QFORGE_HAVE_CUBLAS
#include "kernels/gemm.h"
#endif
#endif

namespace {

constexpr int64_t kBlock = 32;

struct Problem {
  int64_t m, k, n;
  std::vector<float> x;        // [m, k]
  std::vector<uint16_t> x16;   // fp16 bits
  std::vector<float> w;        // dequantized [k, n]
  std::vector<uint8_t> packed;
  std::vector<uint16_t> scales;

  Problem(int64_t m_, int64_t k_, int64_t n_) : m(m_), k(k_), n(n_) {
    std::mt19937 rng(42);
    std::normal_distribution<float> dist(0.0f, 0.5f);
    std::vector<float> weight(static_cast<size_t>(k * n));
    for (float& v : weight) v = dist(rng);
    x.resize(static_cast<size_t>(m * k));
    for (float& v : x) v = dist(rng);
    x16.resize(x.size());
    for (size_t i = 0; i < x.size(); ++i) x16[i] = qforge::f32_to_f16(x[i]);
    scales.resize(static_cast<size_t>(qforge::int4_block_count(k, kBlock) * n));
    packed.resize(static_cast<size_t>(qforge::int4_packed_bytes(k * n)));
    qforge::quantize_int4_blocked(weight, k, n, kBlock, scales, packed, qforge::Device::Cpu);
    w.resize(weight.size());
    qforge::dequantize_int4_blocked(packed, scales, k, n, kBlock, w, qforge::Device::Cpu);
  }
  qforge::Int4Weight view() const {
    return {.packed = packed, .scales_f16 = scales, .k = k, .n = n, .block_size = kBlock};
  }
  double int4_bytes() const {
    return static_cast<double>(packed.size() + scales.size() * 2);
  }
};

void weight_rate(benchmark::State& state, double weight_bytes) {
  state.counters["weight_bytes_per_s"] = benchmark::Counter(
      weight_bytes * static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
}

void BM_Int4MatmulCpu(benchmark::State& state) {
  const Problem p(state.range(0), state.range(1), state.range(2));
  std::vector<float> y(static_cast<size_t>(p.m * p.n));
  for (auto _ : state) {
    qforge::int4_matmul(p.x, p.m, p.view(), y, qforge::Device::Cpu);
    benchmark::DoNotOptimize(y.data());
  }
  weight_rate(state, p.int4_bytes());
  state.SetItemsProcessed(state.iterations() * 2 * p.m * p.k * p.n);  // flops
}

void BM_SgemmDequantized(benchmark::State& state) {
  const Problem p(state.range(0), state.range(1), state.range(2));
  std::vector<float> y(static_cast<size_t>(p.m * p.n));
  for (auto _ : state) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(p.m),
                static_cast<int>(p.n), static_cast<int>(p.k), 1.0f, p.x.data(),
                static_cast<int>(p.k), p.w.data(), static_cast<int>(p.n), 0.0f, y.data(),
                static_cast<int>(p.n));
    benchmark::DoNotOptimize(y.data());
  }
  weight_rate(state, static_cast<double>(p.w.size() * 4));
  state.SetItemsProcessed(state.iterations() * 2 * p.m * p.k * p.n);
}

// What the unfused runtime does on every run: DequantizeLinear (the int4 kernel's CPU
// dequantization into a fresh f32 weight), then sgemm.
void BM_DequantizeThenSgemm(benchmark::State& state) {
  const Problem p(state.range(0), state.range(1), state.range(2));
  std::vector<float> y(static_cast<size_t>(p.m * p.n));
  for (auto _ : state) {
    std::vector<float> w(p.w.size());
    qforge::dequantize_int4_blocked(p.packed, p.scales, p.k, p.n, kBlock, w, qforge::Device::Cpu);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(p.m),
                static_cast<int>(p.n), static_cast<int>(p.k), 1.0f, p.x.data(),
                static_cast<int>(p.k), w.data(), static_cast<int>(p.n), 0.0f, y.data(),
                static_cast<int>(p.n));
    benchmark::DoNotOptimize(y.data());
  }
  weight_rate(state, p.int4_bytes());
  state.SetItemsProcessed(state.iterations() * 2 * p.m * p.k * p.n);
}

#ifdef QFORGE_HAVE_CUDA
#define CHECK_CUDA(expr)                                                           \
  do {                                                                             \
    if (const cudaError_t e_ = (expr); e_ != cudaSuccess) {                        \
      state.SkipWithError(cudaGetErrorString(e_));                                 \
      return;                                                                      \
    }                                                                              \
  } while (0)

double peak_bandwidth() {  // bytes per second
  int dev = 0, khz = 0, bits = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&khz, cudaDevAttrMemoryClockRate, dev);
  cudaDeviceGetAttribute(&bits, cudaDevAttrGlobalMemoryBusWidth, dev);
  return 2.0 * khz * 1e3 * bits / 8.0;  // double data rate
}

// Times `launch` with CUDA events per iteration; counts `bytes` moved per call.
template <typename F>
void time_on_device(benchmark::State& state, double bytes, F launch) {
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  launch();  // warm-up (cuBLAS handle, module load)
  CHECK_CUDA(cudaDeviceSynchronize());
  for (auto _ : state) {
    cudaEventRecord(start);
    launch();
    cudaEventRecord(stop);
    cudaEventSynchronize(stop);
    float ms = 0.0f;
    cudaEventElapsedTime(&ms, start, stop);
    state.SetIterationTime(ms / 1e3);
  }
  CHECK_CUDA(cudaGetLastError());
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  state.counters["bytes_per_s"] =
      benchmark::Counter(bytes * static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
  state.counters["peak_GBps"] = peak_bandwidth() / 1e9;
}

template <typename T>
T* to_device(benchmark::State& state, const void* host, size_t bytes) {
  void* d = nullptr;
  if (cudaMalloc(&d, bytes) != cudaSuccess || cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice) != cudaSuccess) {
    state.SkipWithError("cudaMalloc/cudaMemcpy failed");
    return nullptr;
  }
  return static_cast<T*>(d);
}

void BM_Int4MatmulCuda(benchmark::State& state) {
  const Problem p(state.range(0), state.range(1), state.range(2));
  auto* x = to_device<uint16_t>(state, p.x16.data(), p.x16.size() * 2);
  auto* packed = to_device<uint8_t>(state, p.packed.data(), p.packed.size());
  auto* scales = to_device<uint16_t>(state, p.scales.data(), p.scales.size() * 2);
  void* y = nullptr;
  CHECK_CUDA(cudaMalloc(&y, static_cast<size_t>(p.m * p.n) * 2));
  qforge::cuda::Int4MatmulDeviceArgs a;
  a.x = x;
  a.m = p.m;
  a.k = p.k;
  a.n = p.n;
  a.block_size = kBlock;
  a.packed = packed;
  a.scales = scales;
  a.y = y;
  a.y_f16 = true;
  const double bytes = p.int4_bytes() + static_cast<double>(p.x16.size() * 2 + p.m * p.n * 2);
  time_on_device(state, bytes, [&] { qforge::cuda::int4_matmul_device(a, nullptr); });
  cudaFree(x);
  cudaFree(packed);
  cudaFree(scales);
  cudaFree(y);
}

#if QFORGE_HAVE_CUBLAS
void BM_CublasHgemm(benchmark::State& state) {
  const Problem p(state.range(0), state.range(1), state.range(2));
  std::vector<uint16_t> w16(p.w.size());
  for (size_t i = 0; i < w16.size(); ++i) w16[i] = qforge::f32_to_f16(p.w[i]);
  auto* x = to_device<uint16_t>(state, p.x16.data(), p.x16.size() * 2);
  auto* w = to_device<uint16_t>(state, w16.data(), w16.size() * 2);
  void* y = nullptr;
  CHECK_CUDA(cudaMalloc(&y, static_cast<size_t>(p.m * p.n) * 2));
  qforge::GemmShape g;
  g.m = p.m;
  g.n = p.n;
  g.k = p.k;
  g.lda = p.k;
  g.ldb = p.n;
  g.ldc = p.n;
  const double bytes = static_cast<double>(w16.size() * 2 + p.x16.size() * 2 + p.m * p.n * 2);
  time_on_device(state, bytes, [&] { qforge::gemm_f16_device(g, x, w, y, nullptr); });
  cudaFree(x);
  cudaFree(w);
  cudaFree(y);
}
#endif
#endif

void shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"M", "K", "N"});
  for (const int64_t m : {1, 16}) {
    b->Args({m, 384, 1536});
    b->Args({m, 4096, 4096});
  }
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  benchmark::RegisterBenchmark("BM_Int4MatmulCpu", BM_Int4MatmulCpu)
      ->Apply(shapes)
      ->UseRealTime()
      ->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark("BM_SgemmDequantized", BM_SgemmDequantized)
      ->Apply(shapes)
      ->UseRealTime()
      ->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark("BM_DequantizeThenSgemm", BM_DequantizeThenSgemm)
      ->Apply(shapes)
      ->UseRealTime()
      ->Unit(benchmark::kMicrosecond);
#ifdef QFORGE_HAVE_CUDA
  if (qforge::cuda_available()) {
    benchmark::RegisterBenchmark("BM_Int4MatmulCuda", BM_Int4MatmulCuda)
        ->Apply(shapes)
        ->UseManualTime()
        ->Unit(benchmark::kMicrosecond);
#if QFORGE_HAVE_CUBLAS
    benchmark::RegisterBenchmark("BM_CublasHgemm", BM_CublasHgemm)
        ->Apply(shapes)
        ->UseManualTime()
        ->Unit(benchmark::kMicrosecond);
#else
    std::printf("built without cuBLAS headers: the cuBLAS fp16 GEMM comparison is skipped\n");
#endif
  } else {
    std::printf("no CUDA device: the CUDA W4A16 and cuBLAS benchmarks are skipped\n");
  }
#else
  std::printf("no CUDA device: this build has no CUDA (the CUDA benchmarks are skipped)\n");
#endif
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
