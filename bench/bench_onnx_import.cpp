// import_onnx against the floor of reading the same bytes with read(), on a ~512 MiB model
// with its weights inside the protobuf and again with them in an external data file (which
// the importer maps instead of reading). Each iteration times both; the `ratio` counter is
// import time / read time. QFORGE_BENCH_ONNX_MB sets the model size (default 512).
#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "exporters/onnx/onnx_exporter.h"
#include "importers/onnx/onnx_importer.h"

namespace {

using Clock = std::chrono::steady_clock;

struct BenchModels {
  std::filesystem::path dir;
  std::filesystem::path inline_model;
  std::filesystem::path external_model;
  std::filesystem::path external_data;

  BenchModels() {
    dir = std::filesystem::temp_directory_path() /
          (std::string("qforge-bench-onnx-") + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    inline_model = dir / "inline.onnx";
    external_model = dir / "external.onnx";
    external_data = dir / "external.onnx.data";

    const char* env = std::getenv("QFORGE_BENCH_ONNX_MB");
    const int64_t total_mb = env != nullptr ? std::max(4L, std::atol(env)) : 512;
    // Four large f32 weights of equal size, as a few big layers would be.
    const int64_t rows = total_mb * 1024 * 1024 / 4 / 4 / 1024;
    qforge::Graph g;
    g.name = "bench";
    g.set_opset("", 17);
    for (int i = 0; i < 4; ++i) {
      qforge::Tensor t(qforge::DType::F32, {rows, 1024});
      auto bytes = t.mutable_bytes();
      for (size_t b = 0; b < bytes.size(); b += 4096) bytes[b] = static_cast<std::byte>(b / 4096 + static_cast<size_t>(i));
      const std::string name = std::string("w") + std::to_string(i);
      g.set_initializer(name, std::move(t));
      g.outputs.push_back({.name = name});
    }
    qforge::OnnxExportOptions options;
    options.run_checker = false;
    qforge::export_onnx(g, inline_model, options);
    options.external_data = true;
    qforge::export_onnx(g, external_model, options);
  }
  ~BenchModels() {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
};

const BenchModels& models() {
  static const BenchModels m;
  return m;
}

// Reads whole files with read() into a new buffer, as an importer that copies must: the floor
// for one. (A buffer reused across iterations would skip the page faults import pays.)
std::unique_ptr<char[]> read_files(const std::vector<std::filesystem::path>& paths,
                                   size_t& total) {
  total = 0;
  for (const auto& p : paths) total += std::filesystem::file_size(p);
  std::unique_ptr<char[]> buffer(new char[total]);
  size_t at = 0;
  for (const auto& p : paths) {
    const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw std::runtime_error("cannot open " + p.string());
    for (ssize_t n; (n = ::read(fd, buffer.get() + at, total - at)) > 0;) {
      at += static_cast<size_t>(n);
    }
    ::close(fd);
  }
  if (at != total) throw std::runtime_error("short read");
  return buffer;
}

void run(benchmark::State& state, const std::filesystem::path& model,
         const std::vector<std::filesystem::path>& files) {
  double read_s = 0.0;
  double import_s = 0.0;
  size_t bytes = 0;
  for (auto _ : state) {
    const auto t0 = Clock::now();
    {
      auto buffer = read_files(files, bytes);
      benchmark::DoNotOptimize(buffer.get());
    }
    const auto t1 = Clock::now();
    qforge::Graph g = qforge::import_onnx(model);
    benchmark::DoNotOptimize(g.initializers().data());
    const auto t2 = Clock::now();
    const double this_import = std::chrono::duration<double>(t2 - t1).count();
    read_s += std::chrono::duration<double>(t1 - t0).count();
    import_s += this_import;
    state.SetIterationTime(this_import);
  }
  state.SetBytesProcessed(static_cast<int64_t>(bytes) * state.iterations());
  state.counters["read_ms"] = benchmark::Counter(1e3 * read_s / static_cast<double>(state.iterations()));
  state.counters["import_ms"] = benchmark::Counter(1e3 * import_s / static_cast<double>(state.iterations()));
  state.counters["ratio"] = benchmark::Counter(import_s / read_s);
  state.counters["MiB"] = benchmark::Counter(static_cast<double>(bytes) / (1 << 20));
}

void BM_ImportOnnxInline(benchmark::State& state) {
  run(state, models().inline_model, {models().inline_model});
}

void BM_ImportOnnxExternal(benchmark::State& state) {
  run(state, models().external_model, {models().external_model, models().external_data});
}

// The reported time is import_onnx alone; read() is timed beside it for the ratio.
BENCHMARK(BM_ImportOnnxInline)->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(3);
BENCHMARK(BM_ImportOnnxExternal)->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(3);

}  // namespace

BENCHMARK_MAIN();
