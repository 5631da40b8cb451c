// Calibration kernel throughput: min/max and the |x| histogram over 64 MiB of f32 activations,
// against memcpy of the same bytes in the same run, plus the entropy and MSE threshold searches
// over one 2048-bin histogram. CUDA variants are registered only when a device answers; their
// bytes/s include the copy of the input to the device (the kernels take host buffers), so
// compare them with the link's bandwidth as well as the GPU memory's.
//
// bytes_per_second counts f32 input bytes (64 MiB per iteration). At the end the program prints
// each kernel's rate as a fraction of memcpy's.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <span>
#include <vector>

#include "kernels/calib.h"
#include "kernels/device.h"

namespace {

constexpr int64_t kCount = int64_t{16} << 20;  // 16 Mi floats = 64 MiB
constexpr int64_t kBytes = kCount * static_cast<int64_t>(sizeof(float));

// ReLU-like activations: a third exact zeros, the rest spread over a few decades.
const std::vector<float>& activations() {
  static const std::vector<float> x = [] {
    std::vector<float> v(static_cast<size_t>(kCount));
    uint32_t state = 2024u;
    for (float& f : v) {
      state = state * 1664525u + 1013904223u;
      const auto r = static_cast<int32_t>(state >> 8) - (1 << 23);
      f = r % 3 == 0 ? 0.0f : static_cast<float>(r) * 1e-6f;
    }
    return v;
  }();
  return x;
}

std::vector<uint64_t> histogram_of_activations() {
  std::vector<uint64_t> h(2048, 0);
  const auto& x = activations();
  qforge::histogram_abs(x, qforge::minmax(x, qforge::Device::Cpu).max, h, qforge::Device::Cpu);
  return h;
}

void BM_Memcpy(benchmark::State& state) {
  const auto& src = activations();
  std::vector<float> dst(src.size(), 1.0f);  // touched up front so page faults stay out
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), static_cast<size_t>(kBytes));
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * kBytes);
}

void set_threads(benchmark::State& state, qforge::Device device) {
  qforge::set_cpu_threads(device == qforge::Device::Cpu ? static_cast<int>(state.range(0)) : 0);
}

void BM_MinMax(benchmark::State& state, qforge::Device device) {
  set_threads(state, device);
  const auto& x = activations();
  for (auto _ : state) benchmark::DoNotOptimize(qforge::minmax(x, device));
  state.SetBytesProcessed(state.iterations() * kBytes);
  qforge::set_cpu_threads(0);
}

void BM_Histogram(benchmark::State& state, qforge::Device device) {
  set_threads(state, device);
  const auto& x = activations();
  std::vector<uint64_t> bins(2048, 0);
  for (auto _ : state) {
    qforge::histogram_abs(x, 8.0f, bins, device);
    benchmark::DoNotOptimize(bins.data());
  }
  state.SetBytesProcessed(state.iterations() * kBytes);
  qforge::set_cpu_threads(0);
}

void BM_EntropySearch(benchmark::State& state, qforge::Device device) {
  set_threads(state, device);
  const auto h = histogram_of_activations();
  for (auto _ : state) benchmark::DoNotOptimize(qforge::entropy_threshold(h, 128, device));
  qforge::set_cpu_threads(0);
}

void BM_MseSearch(benchmark::State& state, qforge::Device device) {
  set_threads(state, device);
  const auto h = histogram_of_activations();
  for (auto _ : state) benchmark::DoNotOptimize(qforge::mse_threshold(h, 127, device));
  qforge::set_cpu_threads(0);
}

// The MSE search of 64 tensors' histograms in one call (mse_thresholds, as calibrate() searches
// a model's tensors): the time over 64 is the figure to set beside BM_MseSearch's.
void BM_MseSearchMany(benchmark::State& state, qforge::Device device) {
  set_threads(state, device);
  const auto h = histogram_of_activations();
  const std::vector<std::span<const uint64_t>> hists(64, std::span<const uint64_t>(h));
  for (auto _ : state) benchmark::DoNotOptimize(qforge::mse_thresholds(hists, 127, device));
  state.SetItemsProcessed(state.iterations() * 64);  // histograms per second
  qforge::set_cpu_threads(0);
}

void register_all() {
  benchmark::RegisterBenchmark("BM_Memcpy", BM_Memcpy)
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond);
  for (const auto& [name, fn] :
       std::vector<std::pair<std::string, void (*)(benchmark::State&, qforge::Device)>>{
           {"BM_MinMax", BM_MinMax},
           {"BM_Histogram", BM_Histogram},
           {"BM_EntropySearch", BM_EntropySearch},
           {"BM_MseSearch", BM_MseSearch},
           {"BM_MseSearchMany", BM_MseSearchMany}}) {
    benchmark::RegisterBenchmark((name + "/cpu").c_str(), fn, qforge::Device::Cpu)
        ->ArgName("threads")
        ->Arg(1)
        ->Arg(2)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
    if (qforge::cuda_available()) {
      benchmark::RegisterBenchmark((name + "/cuda").c_str(), fn, qforge::Device::Cuda)
          ->Arg(0)
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
    }
  }
}

// Console output as usual, plus each run's bytes/s kept for the ratio table.
class RatioReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& run : runs) {
      const auto it = run.counters.find("bytes_per_second");
      if (run.error_occurred || it == run.counters.end()) continue;
      rates_[run.benchmark_name()] = it->second.value;
    }
  }

  void print_ratios() const {
    const auto memcpy_it = rates_.find("BM_Memcpy/real_time");
    if (memcpy_it == rates_.end() || memcpy_it->second <= 0.0) return;
    std::printf("\nkernel / memcpy (f32 input bytes per second; memcpy %.2f GB/s):\n",
                memcpy_it->second / 1e9);
    for (const auto& [name, rate] : rates_) {
      if (name == memcpy_it->first) continue;
      std::printf("  %-40s %7.2f GB/s  ratio %.3f\n", name.c_str(), rate / 1e9,
                  rate / memcpy_it->second);
    }
  }

 private:
  std::map<std::string, double> rates_;
};

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  register_all();
  RatioReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  reporter.print_ratios();
  benchmark::Shutdown();
  return 0;
}
