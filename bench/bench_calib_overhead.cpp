// Calibration overhead: `calibrate` (every method) over plain inference on the same samples,
// same batch size and threads, in one process: the model run alone (the Executor over every
// batch, each cut to its longest sequence, in batches of like lengths, as calibration runs
// them), then calibrate() with minmax, percentile, entropy and mse. Prints each method's seconds
// and its ratio to the plain run. Every method is one pass over the data (the histogram methods
// count power-of-two bins that widen as they go, quant/calib/observer.h); the histogram methods
// then search every calibrated tensor's histogram.
//
//   build/bench/bench_calib_overhead MODEL.onnx DATA.npz [--batch 32] [--threads 1] [--reps 3]
//                                    [--scope all|int8]
//
// --scope int8 observes only what `convert --quant int8` to an .onnx file observes: the
// activations static INT8 can read with its default op types (static_int8_range_needs);
// all (the default) observes every activation, as `calibrate` does.
//
// Each figure is the median of --reps runs (the plain run is repeated between the methods, and
// its median taken over all its runs). The plain run's figure leaves out building its executor
// (printed apart); calibrate()'s includes building its own.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "importers/dataset/dataset.h"
#include "importers/onnx/onnx_importer.h"
#include "ir/calib_methods.h"
#include "ir/error.h"
#include "ir/pass.h"
#include "kernels/cpu_threads_scope.h"
#include "quant/calib/calibration.h"
#include "quant/calib/length_order.h"
#include "quant/calib/token_mask.h"
#include "quant/static/static_int8_plan.h"
#include "runtime/executor.h"

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr,
                 "usage: bench_calib_overhead MODEL.onnx DATA.npz [--batch N] [--threads N] "
                 "[--reps N]\n");
    return 2;
  }
  int64_t batch = 32;
  int threads = 1;
  int reps = 3;
  std::string observe = "all";
  for (int i = 3; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const int value = std::atoi(argv[i + 1]);
    if (flag == "--scope" && (std::string(argv[i + 1]) == "all" ||
                              std::string(argv[i + 1]) == "int8")) {
      observe = argv[i + 1];
    } else if (flag == "--batch") batch = value;
    else if (flag == "--threads") threads = value;
    else if (flag == "--reps") reps = value;
    else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  try {
    const qforge::Graph graph = qforge::import_onnx(argv[1]);
    const std::vector<qforge::ValueInfo> inputs = qforge::calibration_inputs(graph);
    qforge::Dataset data(argv[2], inputs, 0, batch);
    const qforge::CpuThreadsScope scope(threads);
    const std::string mask = qforge::resolve_mask_input(graph, "auto");
    std::optional<std::set<std::string>> only;
    if (observe == "int8") {
      only = qforge::static_int8_range_needs(graph, qforge::StaticInt8Options{});
    }

    const std::vector<qforge::SequenceAxis> axes = qforge::sequence_axes(graph.inputs, mask);
    std::vector<double> plain, built;
    const auto run_plain = [&] {
      const auto build_start = std::chrono::steady_clock::now();
      const qforge::Executor ex(graph, {.device = qforge::Device::Cpu, .threads = threads});
      built.push_back(seconds_since(build_start));
      const auto start = std::chrono::steady_clock::now();
      // The batches calibration runs: of like lengths where it takes them so (length_order.h).
      std::optional<qforge::LengthOrderedBatches> ordered;
      if (qforge::orders_by_length(graph.inputs, mask)) ordered.emplace(data, mask);
      qforge::BatchSource& source = ordered ? static_cast<qforge::BatchSource&>(*ordered) : data;
      source.rewind();
      qforge::BatchSource::Feeds feeds;
      while (source.next(feeds)) {
        // The positions calibration runs: each batch's trailing padding cut (token_mask.h).
        if (!mask.empty()) (void)qforge::cut_trailing_padding(feeds, axes, {feeds, mask});
        (void)ex.run(feeds);
      }
      plain.push_back(seconds_since(start));
    };
    run_plain();  // warm-up: page cache, first-touch pages, BLAS buffers
    plain.clear();
    built.clear();

    struct Row {
      qforge::CalibMethod method;
      std::vector<double> s;
    };
    std::vector<Row> rows;
    for (qforge::CalibMethod m : {qforge::CalibMethod::MinMax, qforge::CalibMethod::Percentile,
                                  qforge::CalibMethod::Entropy, qforge::CalibMethod::Mse}) {
      rows.push_back({m, {}});
    }
    for (int r = 0; r < reps; ++r) {
      for (Row& row : rows) {
        run_plain();
        qforge::CalibOptions o;
        o.method = row.method;
        o.device = qforge::Device::Cpu;
        o.threads = threads;
        o.mask_input = mask;
        o.only = only;
        qforge::PassReport report;
        const auto start = std::chrono::steady_clock::now();
        (void)qforge::calibrate(graph, data, o, report);
        row.s.push_back(seconds_since(start));
      }
    }
    const double base = median(plain);
    std::printf("model %s, data %s: %lld samples, batch %lld, %d thread(s), mask '%s', "
                "observing %s\n",
                argv[1], argv[2], static_cast<long long>(data.size()),
                static_cast<long long>(batch), threads, mask.c_str(),
                only ? "the values static INT8 can read" : "every activation");
    std::printf("%-12s %10s %8s\n", "run", "seconds", "ratio");
    std::printf("%-12s %10.3f %8.2f\n", "inference", base, 1.0);
    std::printf("(building the executor, not in the inference figure: %.3f s)\n", median(built));
    for (const Row& row : rows) {
      const double s = median(row.s);
      std::printf("%-12s %10.3f %8.2f\n",
                  std::string(qforge::calib_method_name(row.method)).c_str(), s, s / base);
    }
  } catch (const qforge::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
