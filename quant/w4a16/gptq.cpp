// GPTQ: see quant/gptq.h. The observer sums X^T X per activation; apply_gptq factors H once per
// activation and quantizes each of its weights, tile of output columns by tile.
#include "quant/w4a16/gptq.h"

#include <cblas.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <mutex>
#include <optional>
#include <set>

#include "ir/error.h"
#include "kernels/cpu/task_pool.h"
#include "ir/half.h"
#include "kernels/device.h"
#include "kernels/int4.h"
#include "quant/w4a16/awq.h"
#include "quant/calib/calibration.h"
#include "quant/weights/transposed.h"
#include "runtime/executor.h"
#include "kernels/gemm.h"

// LAPACK (OpenBLAS ships it; Fortran interface, column-major).
extern "C" {
void dpotrf_(const char* uplo, const int* n, double* a, const int* lda, int* info, size_t);
void dpotri_(const char* uplo, const int* n, double* a, const int* lda, int* info, size_t);
}

namespace qforge {

namespace {

constexpr int64_t kTile = 32;  // output columns per work item: fixed, so results do not depend
                               // on the thread count

bool is_float(DType d) { return d == DType::F32 || d == DType::F16 || d == DType::BF16; }

// A row-major symmetric matrix is its own column-major transpose, so LAPACK's 'L' (lower,
// column-major) works on the row-major upper triangle. Sequential OpenBLAS: the factors are the
// same for any thread count.
void single_threaded_blas() {
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(1); });
}

bool lapack_cholesky(std::vector<double>& a, int64_t k) {
  single_threaded_blas();
  const int n = static_cast<int>(k);
  int info = 0;
  dpotrf_("L", &n, a.data(), &n, &info, 1);
  return info == 0;
}

// U (row-major upper, H^-1 = U^T U) from h; nullopt when H + damping is not positive definite.
std::optional<std::vector<double>> inverse_cholesky_upper(std::vector<double> h, int64_t k) {
  const int n = static_cast<int>(k);
  if (!lapack_cholesky(h, k)) return std::nullopt;  // H = U0^T U0
  int info = 0;
  dpotri_("L", &n, h.data(), &n, &info, 1);  // H^-1, row-major upper triangle
  if (info != 0) return std::nullopt;
  if (!lapack_cholesky(h, k)) return std::nullopt;  // H^-1 = U^T U, row-major upper
  for (int64_t r = 0; r < k; ++r)
    for (int64_t c = 0; c < r; ++c) h[static_cast<size_t>(r * k + c)] = 0.0;
  return h;
}

// GPTQ on the columns [c0, c0 + t) of w [K, N], given U [K, K].
void gptq_tile(std::span<const float> w, int64_t k, int64_t n, int64_t c0, int64_t t,
               std::span<const double> u, const std::vector<char>& dead, const GptqOptions& o,
               std::span<int8_t> q, std::span<uint16_t> scales) {
  const int64_t bs = o.block_size, lazy = std::max<int64_t>(1, o.lazy_batch);
  std::vector<double> wt(static_cast<size_t>(k * t));  // the tile, updated as rows are done
  for (int64_t r = 0; r < k; ++r)
    for (int64_t c = 0; c < t; ++c)
      wt[static_cast<size_t>(r * t + c)] =
          dead[static_cast<size_t>(r)] ? 0.0 : w[static_cast<size_t>(r * n + c0 + c)];
  std::vector<double> err(static_cast<size_t>(lazy * t));
  std::vector<float> block, scale(static_cast<size_t>(t));
  std::vector<uint16_t> bits(static_cast<size_t>(t));
  std::vector<uint8_t> packed;
  for (int64_t i1 = 0, i2 = 0; i1 < k; i1 = i2) {
    // A block's scales need every earlier row's error on all its rows: a batch ends where a
    // block starts that would reach past it (never with the pass's sizes: 128 is a multiple of
    // blocks up to 128 and 256 starts on a batch).
    i2 = std::min(k, i1 + lazy);
    for (int64_t b = (i1 / bs + 1) * bs; b < i2; b += bs) {
      if (std::min(b + bs, k) > i2) {
        i2 = b;
        break;
      }
    }
    for (int64_t i = i1; i < i2; ++i) {
      if (i % bs == 0) {  // a block starts: its scales from its current weights
        const int64_t len = std::min(bs, k - i);
        block.resize(static_cast<size_t>(len * t));
        for (size_t j = 0; j < block.size(); ++j)
          block[j] = static_cast<float>(wt[static_cast<size_t>(i * t) + j]);
        packed.resize(static_cast<size_t>(int4_packed_bytes(len * t)));
        quantize_int4_blocked(block, len, t, len, bits, packed, Device::Cpu, o.scale);
        for (int64_t c = 0; c < t; ++c) {
          const auto ci = static_cast<size_t>(c);
          scales[static_cast<size_t>((i / bs) * n + c0 + c)] = bits[ci];
          scale[ci] = f16_to_f32(bits[ci]);
        }
      }
      const double d = u[static_cast<size_t>(i * k + i)];
      for (int64_t c = 0; c < t; ++c) {
        const auto ci = static_cast<size_t>(c);
        const double x = wt[static_cast<size_t>(i * t + c)];
        // As the kernels: round half to even of w / scale in f32, clamped to [-8, 7].
        const float qv = std::clamp(std::nearbyint(static_cast<float>(x) / scale[ci]), -8.0f, 7.0f);
        q[static_cast<size_t>(i * n + c0 + c)] = static_cast<int8_t>(qv);
        err[static_cast<size_t>((i - i1) * t + c)] =
            (x - static_cast<double>(qv) * static_cast<double>(scale[ci])) / d;
      }
      for (int64_t j = i + 1; j < i2; ++j) {
        const double uij = u[static_cast<size_t>(i * k + j)];
        if (uij == 0.0) continue;
        for (int64_t c = 0; c < t; ++c)
          wt[static_cast<size_t>(j * t + c)] -= err[static_cast<size_t>((i - i1) * t + c)] * uij;
      }
    }
    // The batch's errors onto the rows after it: W[i2:] -= U[i1:i2, i2:]^T Err (one dgemm;
    // OpenBLAS single-threaded, on a fixed tile: the same bits for any thread count).
    if (i2 < k) {
      GemmShape g;
      g.trans_a = true;
      g.m = k - i2, g.n = t, g.k = i2 - i1, g.lda = k, g.ldb = t, g.ldc = t;
      g.alpha = -1.0f, g.beta = 1.0f;
      gemm_f64(g, u.data() + i1 * k + i2, err.data(), wt.data() + i2 * t);
    }
  }
}

}  // namespace

GptqObserver::GptqObserver(const std::map<std::string, int64_t>& channels) {
  for (const auto& [name, k] : channels) {
    GptqActivation& a = acts_[name];
    a.channels = k;
    a.h.assign(static_cast<size_t>(k * k), 0.0);
  }
}

void GptqObserver::observe(const std::string& name, const Tensor& value) {
  const auto it = acts_.find(name);
  if (it == acts_.end() || !is_float(value.dtype()) || value.rank() == 0) return;
  GptqActivation& a = it->second;
  const int64_t k = a.channels;
  if (value.shape().back() != k) return;
  const std::vector<float> x = value.to_f32();
  const auto rows = static_cast<int64_t>(x.size()) / k;
  if (rows == 0) return;
  std::vector<float> g(static_cast<size_t>(k * k));
  GemmShape shape;  // g[K, K] = x^T x, x stored [rows, K]
  shape.trans_a = true;
  shape.m = k;
  shape.n = k;
  shape.k = rows;
  shape.lda = k;
  shape.ldb = k;
  shape.ldc = k;
  gemm_f32(cpu_threads(), shape, x.data(), x.data(), g.data());
  for (size_t i = 0; i < g.size(); ++i) a.h[i] += static_cast<double>(g[i]);
  a.rows += static_cast<uint64_t>(rows);
}

GptqCalibration collect_gptq_calibration(const Graph& graph, BatchSource& data,
                                         std::span<const W4A16Target> targets, int threads,
                                         const std::string& mask_input, PassReport& report) {
  report.pass = "gptq-calibrate";
  GptqObserver observer(awq_activation_channels(graph, targets));
  auto calib = collect_activations<GptqCalibration>(graph, data, threads, mask_input, observer, report);
  spdlog::info("gptq: H of {} activations over {} samples, {:.2f} s",
               report.stats["activations"].get<int64_t>(), calib.samples, report.seconds);
  return calib;
}

void gptq_quantize(std::span<const float> w, int64_t k, int64_t n, std::span<const double> h,
                   const GptqOptions& options, std::span<int8_t> q, std::span<uint16_t> scales) {
  if (options.block_size < 1) fail_internal("gptq: block size < 1");
  if (static_cast<int64_t>(w.size()) != k * n || static_cast<int64_t>(h.size()) != k * k ||
      static_cast<int64_t>(q.size()) != k * n ||
      static_cast<int64_t>(scales.size()) != int4_block_count(k, options.block_size) * n) {
    fail_internal("gptq: sizes disagree with K " + std::to_string(k) + ", N " + std::to_string(n));
  }
  std::vector<double> hd(h.begin(), h.end());
  std::vector<char> dead(static_cast<size_t>(k), 0);
  double mean = 0.0;
  for (int64_t i = 0; i < k; ++i) {
    double& d = hd[static_cast<size_t>(i * k + i)];
    if (d == 0.0) {
      dead[static_cast<size_t>(i)] = 1;
      d = 1.0;
    }
    mean += d;
  }
  mean /= static_cast<double>(k);
  // The reference fails when H + lambda I is not positive definite; more damping instead.
  std::optional<std::vector<double>> u;
  for (double damp = options.damp; !u; damp *= 10.0) {
    if (damp > 1e6) fail_invalid("gptq: the calibration Hessian cannot be factored (NaN or Inf?)");
    std::vector<double> damped = hd;
    for (int64_t i = 0; i < k; ++i) damped[static_cast<size_t>(i * k + i)] += damp * mean;
    u = inverse_cholesky_upper(std::move(damped), k);
  }
  const int64_t tiles = (n + kTile - 1) / kTile;
  run_tasks(cpu_threads(), tiles, [&](int64_t tile, int) {
    const int64_t c0 = tile * kTile;
    gptq_tile(w, k, n, c0, std::min(kTile, n - c0), *u, dead, options, q, scales);
  });
}

double gptq_output_error(std::span<const float> w, std::span<const float> d, int64_t k, int64_t n,
                         std::span<const double> h, uint64_t rows) {
  std::vector<double> e(static_cast<size_t>(k * n));
  for (size_t i = 0; i < e.size(); ++i)
    e[i] = static_cast<double>(w[i]) - static_cast<double>(d[i]);
  // sum over columns c of e_c^T H e_c = sum(E .* (H E)); H E in one single-threaded dgemm.
  std::vector<double> he(e.size());
  GemmShape g;
  g.m = k, g.n = n, g.k = k, g.lda = k, g.ldb = n, g.ldc = n;
  gemm_f64(g, h.data(), e.data(), he.data());
  double total = 0.0;
  for (size_t i = 0; i < e.size(); ++i) total += e[i] * he[i];
  return rows > 0 ? total / static_cast<double>(rows) : total;
}

std::map<std::string, GptqWeight> apply_gptq(const Graph& graph,
                                             std::span<const W4A16Target> targets,
                                             const GptqCalibration& calib,
                                             const GptqOptions& options, PassReport& report) {
  const auto start = std::chrono::steady_clock::now();
  // Weight -> the activations its uses read (a weight GPTQ handles reads exactly one).
  std::map<std::string, std::set<std::string>> acts;
  std::map<std::string, int64_t> axis;
  std::vector<std::string> order;
  for (const W4A16Target& t : targets) {
    if (!acts.count(t.weight)) order.push_back(t.weight);
    const auto a = awq_activation_of(graph, t);
    acts[t.weight].insert(a ? *a : std::string());
    axis[t.weight] = t.axis;
  }
  report.stats["gptq"] = nlohmann::ordered_json::array();
  report.stats["gptq_damp"] = options.damp;
  std::map<std::string, GptqWeight> out;
  double sum_rtn = 0.0, sum_gptq = 0.0;
  for (size_t number = 0; number < order.size(); ++number) {
    const std::string& name = order[number];
    const std::set<std::string>& a = acts[name];
    const Tensor& tensor = *graph.find_initializer(name);
    const int64_t ax = axis[name];
    const int64_t k = tensor.shape()[static_cast<size_t>(ax)];
    const auto c = a.size() == 1 ? calib.activations.find(*a.begin()) : calib.activations.end();
    if (a.size() != 1 || a.begin()->empty() || c == calib.activations.end() ||
        c->second.rows == 0 || c->second.channels != k) {
      report.warn("gptq: weight '" + name +
                  "' has no calibration activation of its own (no rows, or read by several "
                  "inputs): rounded to nearest");
      report.count("gptq_no_data");
      continue;
    }
    const GptqActivation& act = c->second;
    std::vector<float> w = tensor.to_f32();
    const int64_t n = static_cast<int64_t>(w.size()) / k;
    if (ax == 1) w = transposed(std::span<const float>(w), n, k);
    const int64_t bs = options.block_size;
    GptqWeight g;
    g.axis = ax;
    g.q.resize(w.size());
    g.scales.resize(static_cast<size_t>(int4_block_count(k, bs) * n));
    gptq_quantize(w, k, n, act.h, options, g.q, g.scales);

    // The output-error proxy on the calibration data, GPTQ against round-to-nearest.
    std::vector<float> deq(w.size()), rtn(w.size());
    for (int64_t r = 0; r < k; ++r)
      for (int64_t col = 0; col < n; ++col) {
        const auto i = static_cast<size_t>(r * n + col);
        deq[i] = static_cast<float>(g.q[i]) *
                 f16_to_f32(g.scales[static_cast<size_t>((r / bs) * n + col)]);
      }
    std::vector<uint16_t> rs(g.scales.size());
    std::vector<uint8_t> packed(static_cast<size_t>(int4_packed_bytes(k * n)));
    quantize_int4_blocked(w, k, n, bs, rs, packed, Device::Cpu, options.scale);
    dequantize_int4_blocked(packed, rs, k, n, bs, rtn, Device::Cpu);
    const double e_rtn = gptq_output_error(w, rtn, k, n, act.h, act.rows);
    const double e_gptq = gptq_output_error(w, deq, k, n, act.h, act.rows);
    sum_rtn += e_rtn;
    sum_gptq += e_gptq;
    int64_t dead = 0;
    for (int64_t i = 0; i < k; ++i) dead += act.h[static_cast<size_t>(i * k + i)] == 0.0 ? 1 : 0;

    nlohmann::ordered_json row;
    row["name"] = name;
    row["activation"] = c->first;
    row["rows"] = act.rows;
    row["dead_inputs"] = dead;
    row["output_error_rtn"] = e_rtn;
    row["output_error_gptq"] = e_gptq;
    row["ratio"] = e_rtn > 0.0 ? e_gptq / e_rtn : 1.0;
    report.stats["gptq"].push_back(std::move(row));
    report.count("gptq_weights");
    spdlog::info("gptq [{}/{}] {} K {} N {}: output error rtn {:.4g} -> gptq {:.4g} ({:.3f})",
                 number + 1, order.size(), name, k, n, e_rtn, e_gptq,
                 e_rtn > 0.0 ? e_gptq / e_rtn : 1.0);
    out.emplace(name, std::move(g));
  }
  report.stats["gptq_output_error_rtn"] = sum_rtn;
  report.stats["gptq_output_error_gptq"] = sum_gptq;
  report.stats["gptq_seconds"] =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return out;
}

}  // namespace qforge
