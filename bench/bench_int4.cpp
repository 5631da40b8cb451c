// Block-wise INT4 weight quantization (W4A16) throughput against memcpy of the same 64 MiB, in
// one run, so the ratio says how close the kernel gets to memory bandwidth on this machine.
//
// bytes_per_second counts f32 input bytes (64 MiB per iteration). Quantize reads the input twice
// (block amax, then quantize and pack) and writes an eighth of it plus the fp16 scales; memcpy
// reads it once and writes it once. At the end the program prints int4 / memcpy per case.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "ir/half.h"
#include "ir/tensor.h"
#include "kernels/device.h"
#include "kernels/int4.h"
#include "quant/weights/int4_group_quant.h"

namespace {

constexpr int64_t kRows = 4096;  // K, the blocked axis
constexpr int64_t kCols = 4096;  // N; [4096, 4096] f32 = 64 MiB
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

// Args: threads, block size, scale search (0: amax / 7, 1: Int4Scale::Mse).
void BM_QuantizeInt4Blocked(benchmark::State& state) {
  qforge::set_cpu_threads(static_cast<int>(state.range(0)));
  const int64_t block = state.range(1);
  const auto scale = state.range(2) != 0 ? qforge::Int4Scale::Mse : qforge::Int4Scale::Amax;
  const std::vector<float> w = make_weights();
  std::vector<uint16_t> scales(static_cast<size_t>(qforge::int4_block_count(kRows, block) * kCols));
  std::vector<uint8_t> packed(static_cast<size_t>(qforge::int4_packed_bytes(kRows * kCols)), 1);
  for (auto _ : state) {
    qforge::quantize_int4_blocked(w, kRows, kCols, block, scales, packed, qforge::Device::Cpu,
                                  scale);
    benchmark::DoNotOptimize(packed.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * kBytes);
  qforge::set_cpu_threads(0);
}

// The model-folder path (quant/weights/int4_group_quant.h): a bf16 Linear weight [4096, 4096]
// (out, in) quantized in groups along `in`, as LLM exports run it. bytes_per_second counts the
// f32 bytes of the same values (64 MiB), so the ratio to memcpy compares with the rows above.
// The values are a sum of four uniforms (roughly Gaussian, as trained weights): the scale search
// takes a path that depends on the data. Args: threads, block size, scale search.
void BM_Int4Groups(benchmark::State& state) {
  qforge::set_cpu_threads(static_cast<int>(state.range(0)));
  const int64_t block = state.range(1);
  const auto scale = state.range(2) != 0 ? qforge::Int4Scale::Mse : qforge::Int4Scale::Amax;
  std::vector<float> w(static_cast<size_t>(kRows * kCols));
  uint32_t lcg = 777u;
  auto uniform = [&] {
    lcg = lcg * 1664525u + 1013904223u;
    return static_cast<float>(lcg >> 8) * 0x1p-24f - 0.5f;
  };
  for (float& v : w) v = (uniform() + uniform() + uniform() + uniform()) * 0.02f;
  const qforge::Tensor weight = qforge::Tensor::from_f32(w, {kRows, kCols}, qforge::DType::BF16);
  for (auto _ : state) {
    qforge::Int4GroupQuant q = qforge::quantize_int4_groups(weight, block, scale);
    benchmark::DoNotOptimize(q.values.bytes().data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * kBytes);
  qforge::set_cpu_threads(0);
}

BENCHMARK(BM_Memcpy)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_QuantizeInt4Blocked)
    ->ArgNames({"threads", "block", "search"})
    ->ArgsProduct({{1, 2}, {32, 128}, {0, 1}})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Int4Groups)
    ->ArgNames({"threads", "block", "search"})
    ->ArgsProduct({{1, 2}, {32, 128}, {0, 1}})
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
      rates_[run.benchmark_name()] = it->second.value;
    }
  }

  void print_ratios() const {
    double memcpy_rate = 0.0;
    for (const auto& [name, rate] : rates_) {
      if (name.rfind("BM_Memcpy", 0) == 0) memcpy_rate = rate;
    }
    if (memcpy_rate <= 0.0) return;
    std::printf("\nint4 / memcpy (f32 input bytes per second; memcpy %.2f GiB/s):\n",
                memcpy_rate / (1u << 30));
    for (const auto& [name, rate] : rates_) {
      if (name.rfind("BM_QuantizeInt4", 0) != 0 && name.rfind("BM_Int4Groups", 0) != 0) continue;
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
