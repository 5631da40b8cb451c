// Loading a safetensors checkpoint: import (header + memory map) alone, and import plus a read
// of one byte in every 4 KiB page of every tensor, which is what a consumer of the weights pays.
//   QFORGE_BENCH_CHECKPOINT=model.safetensors (or *.safetensors.index.json) picks the file;
//   without it a 64 MiB synthetic checkpoint is written to a temporary folder first.
//   QFORGE_BENCH_ITERATIONS=N fixes the iteration count (bench_load_checkpoint.py runs 1 per
//   fresh process, so that the page touches are not amortized across iterations).
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "exporters/safetensors/safetensors_writer.h"
#include "importers/safetensors/safetensors_reader.h"

namespace {

namespace fs = std::filesystem;

// 16 tensors of 1024 x 1024 f32: 64 MiB.
fs::path write_synthetic_checkpoint(const fs::path& folder) {
  qforge::Graph g;
  for (int i = 0; i < 16; ++i) {
    qforge::Tensor t(qforge::DType::F32, {1024, 1024});
    auto values = t.mutable_data<float>();
    for (size_t k = 0; k < values.size(); ++k) values[k] = static_cast<float>((k + i) % 97);
    g.set_initializer("layers." + std::to_string(i) + ".weight", std::move(t));
  }
  fs::create_directories(folder);
  const fs::path path = folder / "synthetic.safetensors";
  qforge::export_safetensors(g, path);
  return path;
}

uint64_t touch_pages(const qforge::Graph& g) {
  uint64_t sum = 0;
  for (const auto& [name, t] : g.initializers()) {
    const auto bytes = t.bytes();
    for (size_t i = 0; i < bytes.size(); i += 4096) sum += static_cast<uint8_t>(bytes[i]);
  }
  return sum;
}

void BM_Import(benchmark::State& state, const fs::path& path) {
  for (auto _ : state) {
    const qforge::Graph g = qforge::import_safetensors_any(path);
    benchmark::DoNotOptimize(g.initializers().size());
  }
}

void BM_ImportAndTouch(benchmark::State& state, const fs::path& path) {
  uint64_t bytes = 0;
  for (auto _ : state) {
    const qforge::Graph g = qforge::import_safetensors_any(path);
    benchmark::DoNotOptimize(touch_pages(g));
    bytes = g.parameter_bytes();
  }
  state.SetBytesProcessed(static_cast<int64_t>(bytes) * state.iterations());
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  const char* given = std::getenv("QFORGE_BENCH_CHECKPOINT");
  const fs::path scratch =
      fs::temp_directory_path() / ("qforge_bench_load_" + std::to_string(::getpid()));
  const fs::path path = given != nullptr ? fs::path(given) : write_synthetic_checkpoint(scratch);
  const char* iterations = std::getenv("QFORGE_BENCH_ITERATIONS");
  for (auto* b :
       {benchmark::RegisterBenchmark("import_safetensors", BM_Import, path),
        benchmark::RegisterBenchmark("import_safetensors+touch", BM_ImportAndTouch, path)}) {
    b->Unit(benchmark::kMillisecond)->UseRealTime();
    if (iterations != nullptr) b->Iterations(std::atoll(iterations));
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  std::error_code ec;
  fs::remove_all(scratch, ec);
  return 0;
}
