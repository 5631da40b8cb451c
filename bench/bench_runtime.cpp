// Latency of the qforge runtime on one model: QFORGE_BENCH_MODEL names the .onnx file and
// QFORGE_BENCH_INPUTS an .npz with one array per graph input (as
// tests/interop/runtime_make_ort_fixtures.py writes them). One benchmark per thread count
// (1 and 2); bench/bench_runtime.py runs this next to ONNX Runtime.
//
//   QFORGE_BENCH_MODEL=m.onnx QFORGE_BENCH_INPUTS=m_inputs.npz build/bench/bench_runtime
//       --benchmark_repetitions=20 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <iostream>

#include "importers/onnx/onnx_importer.h"
#include "ir/error.h"
#include "runtime/executor.h"
#include "importers/dataset/npy.h"

namespace {

void run_model(benchmark::State& state, const qforge::Graph* graph,
               const std::vector<std::pair<std::string, qforge::Tensor>>* feeds) {
  const qforge::Executor ex(
      *graph, {.device = qforge::Device::Cpu, .threads = static_cast<int>(state.range(0))});
  ex.run(*feeds);  // warm-up: first-touch pages, OpenBLAS buffers
  for (auto _ : state) {
    auto out = ex.run(*feeds);
    benchmark::DoNotOptimize(out);
  }
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  const char* model = std::getenv("QFORGE_BENCH_MODEL");
  const char* inputs = std::getenv("QFORGE_BENCH_INPUTS");
  if (model == nullptr || inputs == nullptr) {
    std::cerr << "bench_runtime: set QFORGE_BENCH_MODEL=model.onnx and "
                 "QFORGE_BENCH_INPUTS=inputs.npz (see bench/bench_runtime.py)\n";
    return 2;
  }
  try {
    static const qforge::Graph graph = qforge::import_onnx(model);
    static const auto feeds = qforge::read_npz(inputs);
    benchmark::RegisterBenchmark("runtime", run_model, &graph, &feeds)
        ->Arg(1)
        ->Arg(2)
        ->ArgName("threads")
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
    benchmark::RunSpecifiedBenchmarks();
  } catch (const qforge::Error& e) {
    std::cerr << "bench_runtime: " << e.what() << "\n";
    return 1;
  }
  benchmark::Shutdown();
  return 0;
}
