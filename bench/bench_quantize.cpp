// INT8 weight quantization throughput against memcpy of the same 64 MiB, in one run, so the
// ratio says how close the kernels get to memory bandwidth on this machine.
//
// bytes_per_second counts f32 input bytes (64 MiB per iteration) for every benchmark. Quantize
// reads the input twice (amax, then quantize) and writes a quarter of it; memcpy reads it once
// and writes it once. At the end the program prints quant / memcpy for each quantize case.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "kernels/device.h"
#include "kernels/quantize.h"

namespace {

constexpr int64_t kRows = 4096;
constexpr int64_t kCols = 4096;  // [4096, 4096] f32 = 64 MiB
constexpr int64_t kBytes = kRows * kCols * static_cast<int64_t>(sizeof(float));

std::vector<float> make_weights() {
  std::vector<float> w(static_cast<size_t>(kRows * kCols));
  uint32_t state = 12345u;  // a cheap LCG: the values only need to vary, not be Gaussian
  for (float& v : w) {
    state = state * 1664525u + 1013904223u;
    v = static_cast<float>(static_cast<int32_t>(state >> 8) - (1 << 23)) * 1e-7f;
  }
  return w;
}

void BM_Memcpy(benchmark::State& state) {
  const std::vector<float> src = make_weights();
  std::vector<float> dst(src.size(), 1.0f);  // touched up front so page faults stay out
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), static_cast<size_t>(kBytes));
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * kBytes);
}

// Args: threads, channel axis (0: [C=4096, inner 4096] rows, as Conv/Gemm transB=1;
// 1: [outer 4096, C=4096], as MatMul B[K, N]).
void BM_QuantizePerChannel(benchmark::State& state) {
  qforge::set_cpu_threads(static_cast<int>(state.range(0)));
  const bool axis0 = state.range(1) == 0;
  const int64_t outer = axis0 ? 1 : kRows;
  const int64_t channels = axis0 ? kRows : kCols;
  const int64_t inner = axis0 ? kCols : 1;
  const std::vector<float> w = make_weights();
  std::vector<float> amax(static_cast<size_t>(channels));
  std::vector<float> scales(static_cast<size_t>(channels));
  std::vector<int8_t> q(w.size(), 1);
  for (auto _ : state) {
    qforge::amax_per_channel(w, outer, channels, inner, amax, qforge::Device::Cpu);
    for (size_t c = 0; c < amax.size(); ++c) scales[c] = qforge::int8_symmetric_scale(amax[c]);
    qforge::quantize_int8(w, outer, channels, inner, scales, q, qforge::Device::Cpu);
    benchmark::DoNotOptimize(q.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * kBytes);
  qforge::set_cpu_threads(0);
}

void BM_QuantizePerTensor(benchmark::State& state) {
  qforge::set_cpu_threads(static_cast<int>(state.range(0)));
  const std::vector<float> w = make_weights();
  std::vector<int8_t> q(w.size(), 1);
  const int64_t n = kRows * kCols;
  for (auto _ : state) {
    const float scale = qforge::int8_symmetric_scale(qforge::amax(w, qforge::Device::Cpu));
    qforge::quantize_int8(w, 1, 1, n, std::span<const float>(&scale, 1), q, qforge::Device::Cpu);
    benchmark::DoNotOptimize(q.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * kBytes);
  qforge::set_cpu_threads(0);
}

BENCHMARK(BM_Memcpy)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_QuantizePerChannel)
    ->ArgNames({"threads", "axis"})
    ->ArgsProduct({{1, 2}, {0, 1}})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_QuantizePerTensor)
    ->ArgNames({"threads"})
    ->Args({1})
    ->Args({2})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

// Console output as usual, plus each run's bytes/s kept for the ratio table.
class RatioReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& run : runs) {
      const auto it = run.counters.find("bytes_per_second");
      if (run.error_occurred || it == run.counters.end()) continue;
      rates_[run.benchmark_name()] = it->second.value;  // finished counters: already a rate
    }
  }

  void print_ratios() const {
    double memcpy_rate = 0.0;
    for (const auto& [name, rate] : rates_) {
      if (name.rfind("BM_Memcpy", 0) == 0) memcpy_rate = rate;
    }
    if (memcpy_rate <= 0.0) return;
    std::printf("\nquant / memcpy (f32 input bytes per second; memcpy %.2f GiB/s):\n",
                memcpy_rate / (1u << 30));
    for (const auto& [name, rate] : rates_) {
      if (name.rfind("BM_Quantize", 0) != 0) continue;
      std::printf("  %-48s %.2f GiB/s  ratio %.3f\n", name.c_str(), rate / (1u << 30),
                  rate / memcpy_rate);
    }
  }

 private:
  std::map<std::string, double> rates_;
};

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  RatioReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  reporter.print_ratios();
  benchmark::Shutdown();
  return 0;
}
