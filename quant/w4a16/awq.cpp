// AWQ: see quant/awq.h. Three steps per activation: the observer keeps mean |x| per channel and
// a row sample; the search picks alpha; the rewrite scales the weights' rows and puts 1/s on the
// activation side (folded into its producer, or a Mul).
#include "quant/w4a16/awq.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "ir/error.h"
#include "ir/half.h"
#include "kernels/int4.h"
#include "kernels/quantize.h"
#include "quant/calib/calibration.h"
#include "runtime/executor.h"
#include "kernels/gemm.h"

namespace qforge {

namespace {

constexpr float kMinScale = 1e-4f;  // llm-awq's clamp on mean|x|^alpha

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

bool is_float(DType d) { return d == DType::F32 || d == DType::F16 || d == DType::BF16; }

bool default_domain(const Node& node) { return node.domain.empty() || node.domain == "ai.onnx"; }

// The activation a target weight multiplies (input 0 of MatMul, or of Gemm without transA).
std::optional<std::string> activation_of(const Graph& graph, const W4A16Target& t) {
  const Node& node = graph.nodes[t.node];
  if (!default_domain(node) || t.input != 1 || node.inputs.empty() || node.inputs[0].empty())
    return std::nullopt;
  if (node.op_type == "MatMul" && t.axis == 0) return node.inputs[0];
  if (node.op_type == "Gemm" && node.attr_int("transA", 0) == 0) return node.inputs[0];
  return std::nullopt;
}

// A weight as [K, N] f32, whatever its layout (axis 1: stored [N, K]).
std::vector<float> weight_kn(const Tensor& w, int64_t axis) {
  std::vector<float> v = w.to_f32();
  if (axis == 0) return v;
  const int64_t n = w.shape()[0], k = w.shape()[1];
  std::vector<float> t(v.size());
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < k; ++c)
      t[static_cast<size_t>(c * n + r)] = v[static_cast<size_t>(r * k + c)];
  return t;
}

// y[M, N] = x[M, K] @ w[K, N]. `threads` 1 inside the searches' own parallel loops.
void matmul(const float* x, const float* w, float* y, int64_t m, int64_t k, int64_t n,
            int threads) {
  GemmShape shape;
  shape.m = m;
  shape.n = n;
  shape.k = k;
  shape.lda = k;
  shape.ldb = n;
  shape.ldc = n;
  gemm_f32(threads, shape, x, w, y);
}

// The searches run thousands of small quantize + sgemm steps: one OpenMP region over the
// independent steps (alpha points, clip ratios) with single-threaded steps inside is much
// cheaper than a short parallel region per step. Each step's result is computed exactly as a
// sequential run computes it and the choices are made afterwards in the original order, so the
// output does not depend on the thread count. `bytes_per_task` bounds the memory in flight:
// at most kTaskMemory across threads (fewer threads for very large weights, whose steps are
// then parallel inside).
constexpr int64_t kTaskMemory = int64_t{1} << 30;

int outer_threads(int64_t tasks, int64_t bytes_per_task) {
  const int64_t by_memory =
      std::max<int64_t>(1, kTaskMemory / std::max<int64_t>(1, bytes_per_task));
  return static_cast<int>(
      std::max<int64_t>(1, std::min({static_cast<int64_t>(cpu_threads()), tasks, by_memory})));
}

struct Member {
  W4A16Target target;
  std::vector<float> w;  // [K, N]
  int64_t n = 0;
};

struct Search {
  int best = 0;  // grid index; 0 is round-to-nearest
  double error_rtn = 0.0;
  double error_best = 0.0;
  std::vector<float> s;  // [K], the chosen scales
};

std::vector<float> scales_for(std::span<const float> mean, double alpha) {
  std::vector<float> s(mean.size());
  float lo = 0.0f, hi = 0.0f;
  for (size_t k = 0; k < mean.size(); ++k) {
    s[k] = std::max(static_cast<float>(std::pow(static_cast<double>(mean[k]), alpha)), kMinScale);
    lo = k == 0 ? s[k] : std::min(lo, s[k]);
    hi = k == 0 ? s[k] : std::max(hi, s[k]);
  }
  const float norm = std::sqrt(hi * lo);
  for (float& v : s) v /= norm;
  return s;
}

// `workspace` keeps the device buffers of the grid's quantize/dequantize round trips (on CUDA
// the points run one at a time); null on the CPU, where points run in parallel.
Search search(const AwqActivation& act, std::span<const Member> members, const AwqOptions& o,
              Device device, KernelWorkspace* workspace) {
  const int64_t m = act.sample_rows(), k = act.channels;
  const std::vector<float> mean = act.mean_abs();
  std::vector<std::vector<float>> ref(members.size());
  int64_t max_n = 0;
  for (size_t i = 0; i < members.size(); ++i) {
    ref[i].resize(static_cast<size_t>(m * members[i].n));
    matmul(act.sample.data(), members[i].w.data(), ref[i].data(), m, k, members[i].n,
           cpu_threads());
    max_n = std::max(max_n, members[i].n);
  }
  // One task per alpha point: its error summed over members and rows in the sequential order.
  const int grid = o.grid;
  std::vector<std::vector<float>> scales(static_cast<size_t>(grid));
  std::vector<double> errors(static_cast<size_t>(grid), 0.0);
  const int64_t task_bytes = (2 * k * max_n + m * max_n + m * k) * 4 + k * max_n / 2;
  // CUDA quantizes on the device: one point at a time there.
  const int threads = device == Device::Cpu ? outer_threads(grid, task_bytes) : 1;
  const int inner = threads > 1 ? 1 : cpu_threads();
#pragma omp parallel num_threads(threads)
  {
    std::vector<float> xs(act.sample.size()), ws, deq, y;
    std::vector<uint16_t> sc;
    std::vector<uint8_t> packed;
#pragma omp for schedule(dynamic, 1)
    for (int g = 0; g < grid; ++g) {
      std::vector<float> s = scales_for(mean, static_cast<double>(g) / grid);
      for (int64_t r = 0; r < m; ++r)
        for (int64_t c = 0; c < k; ++c) {
          const auto i = static_cast<size_t>(r * k + c);
          xs[i] = act.sample[i] / s[static_cast<size_t>(c)];
        }
      double error = 0.0;
      for (size_t i = 0; i < members.size(); ++i) {
        const int64_t n = members[i].n;
        ws.resize(members[i].w.size());
        for (int64_t r = 0; r < k; ++r)
          for (int64_t c = 0; c < n; ++c) {
            const auto j = static_cast<size_t>(r * n + c);
            ws[j] = members[i].w[j] * s[static_cast<size_t>(r)];
          }
        sc.assign(static_cast<size_t>(int4_block_count(k, o.block_size) * n), 0);
        packed.assign(static_cast<size_t>(int4_packed_bytes(k * n)), 0);
        deq.resize(ws.size());
        int4_round_trip(ws, k, n, o.block_size, sc, packed, deq, device, o.scale, workspace);
        y.resize(static_cast<size_t>(m * n));
        matmul(xs.data(), deq.data(), y.data(), m, k, n, inner);
        for (size_t j = 0; j < y.size(); ++j) {
          const double d = static_cast<double>(y[j]) - static_cast<double>(ref[i][j]);
          error += d * d;
        }
      }
      errors[static_cast<size_t>(g)] = error;
      scales[static_cast<size_t>(g)] = std::move(s);
    }
  }
  Search out;
  for (int g = 0; g < grid; ++g) {
    const double error = errors[static_cast<size_t>(g)];
    if (g == 0) out.error_rtn = error;
    if (g == 0 || error < out.error_best) {
      out.best = g;
      out.error_best = error;
    }
  }
  out.s = std::move(scales[static_cast<size_t>(out.best)]);
  return out;
}

// AWQ's second step: per block of the scaled weight and output column, the largest |w| is
// shrunk to ratio * amax (ratio 1, 0.95, ..., 0.55, as llm-awq) where that lowers the block's
// share of the output error on the sample, ||X_b diag(1/s)_b (W_b - Q(W_b))||^2 per column.
// Clipped values are written into the float weight, so RTN then picks scale = ratio * amax / 7.
struct Clip {
  std::vector<float> limit;  // [blocks, N]; infinity where the block column is not clipped
  double before = 0.0, after = 0.0;
  int64_t clipped = 0;
};

constexpr int kClipSteps = 10;

Clip clip_search(const AwqActivation& act, std::span<const float> s, const Member& m,
                 const AwqOptions& o) {
  const int64_t rows = act.sample_rows(), k = act.channels, n = m.n, bs = o.block_size;
  std::vector<float> xs(act.sample.size()), ws(m.w.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < k; ++c) {
      const auto i = static_cast<size_t>(r * k + c);
      xs[i] = act.sample[i] / s[static_cast<size_t>(c)];
    }
  for (int64_t r = 0; r < k; ++r)
    for (int64_t c = 0; c < n; ++c) {
      const auto j = static_cast<size_t>(r * n + c);
      ws[j] = m.w[j] * s[static_cast<size_t>(r)];
    }
  const int64_t blocks = int4_block_count(k, bs);
  std::vector<float> amax(static_cast<size_t>(blocks * n), 0.0f);
  for (int64_t b = 0; b < blocks; ++b)
    for (int64_t r = b * bs; r < std::min(k, (b + 1) * bs); ++r)
      for (int64_t c = 0; c < n; ++c) {
        float& a = amax[static_cast<size_t>(b * n + c)];
        a = std::max(a, std::fabs(ws[static_cast<size_t>(r * n + c)]));
      }
  // One task per (block, ratio): its per-column error, [blocks, kClipSteps, n]; the choices are
  // made below in the sequential order.
  const int64_t tasks = blocks * kClipSteps;
  std::vector<double> errs(static_cast<size_t>(tasks * n));
  const int64_t task_bytes = (std::min(bs, k) + rows) * n * 4 + n * 8;
  const int threads = outer_threads(tasks, task_bytes);
  const int inner = threads > 1 ? 1 : cpu_threads();
#pragma omp parallel num_threads(threads)
  {
    std::vector<float> d, e(static_cast<size_t>(rows * n));
    std::vector<float> lims(static_cast<size_t>(n)), scales(static_cast<size_t>(n));
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < tasks; ++t) {
      const int64_t b = t / kClipSteps;
      const int step = static_cast<int>(t % kClipSteps);
      const int64_t r0 = b * bs, len = std::min(bs, k - r0);
      const float* am = amax.data() + b * n;
      d.resize(static_cast<size_t>(len * n));
      const float ratio = 1.0f - static_cast<float>(step) / 20.0f;
      for (int64_t c = 0; c < n; ++c) {
        const auto ci = static_cast<size_t>(c);
        lims[ci] = ratio * am[c];
        scales[ci] = f16_to_f32(int4_symmetric_scale_f16(lims[ci]));
      }
      for (int64_t r = 0; r < len; ++r)
        for (int64_t c = 0; c < n; ++c) {
          const auto ci = static_cast<size_t>(c);
          const float w = ws[static_cast<size_t>((r0 + r) * n + c)];
          const float q = std::clamp(
              std::nearbyint(std::clamp(w, -lims[ci], lims[ci]) / scales[ci]), -8.0f, 7.0f);
          d[static_cast<size_t>(r * n + c)] = w - q * scales[ci];
        }
      GemmShape shape;
      shape.m = rows;
      shape.n = n;
      shape.k = len;
      shape.lda = k;
      shape.ldb = n;
      shape.ldc = n;
      gemm_f32(inner, shape, xs.data() + r0, d.data(), e.data());
      double* col_err = errs.data() + t * n;
      std::fill(col_err, col_err + n, 0.0);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < n; ++c) {
          const double v = e[static_cast<size_t>(r * n + c)];
          col_err[c] += v * v;
        }
    }
  }
  Clip out;
  out.limit.assign(static_cast<size_t>(blocks * n), std::numeric_limits<float>::infinity());
  std::vector<double> best(static_cast<size_t>(n));
  for (int64_t b = 0; b < blocks; ++b) {
    for (int step = 0; step < kClipSteps; ++step) {
      const float ratio = 1.0f - static_cast<float>(step) / 20.0f;
      const double* col_err = errs.data() + (b * kClipSteps + step) * n;
      for (int64_t c = 0; c < n; ++c) {
        const auto ci = static_cast<size_t>(c);
        if (step == 0) {
          best[ci] = col_err[c];
          out.before += col_err[c];
        } else if (col_err[c] < best[ci]) {
          best[ci] = col_err[c];
          out.limit[static_cast<size_t>(b * n + c)] = ratio * amax[static_cast<size_t>(b * n + c)];
        }
      }
    }
    for (int64_t c = 0; c < n; ++c) {
      out.after += best[static_cast<size_t>(c)];
      out.clipped += std::isinf(out.limit[static_cast<size_t>(b * n + c)]) ? 0 : 1;
    }
  }
  return out;
}

// Replaces the producer's constant input `slot` by `values` (shape `shape`, dtype `dtype`): in
// place when only this node reads it (names stay stable for later groups), else as a new
// initializer for this node alone.
void replace_constant(Graph& graph, size_t node, size_t slot, std::span<const float> values,
                      const Shape& shape, DType dtype) {
  const std::string old = graph.nodes[node].inputs[slot];
  bool shared = false;
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    const auto& in = graph.nodes[i].inputs;
    const auto uses = std::count(in.begin(), in.end(), old);
    shared = shared || (i == node ? uses > 1 : uses > 0);
  }
  for (const ValueInfo& v : graph.outputs) shared = shared || v.name == old;
  for (const ValueInfo& v : graph.inputs) shared = shared || v.name == old;
  if (!shared) {
    graph.set_initializer(old, Tensor::from_f32(values, shape, dtype));
    std::erase_if(graph.value_info, [&](const ValueInfo& v) { return v.name == old; });
    return;
  }
  const std::string name = graph.unique_name(old + "_awq");
  graph.set_initializer(name, Tensor::from_f32(values, shape, dtype));
  graph.nodes[node].inputs[slot] = name;
}

// A constant of K values along the last axis (shape [K], [1, K], ...) or a scalar.
bool per_channel_or_scalar(const Tensor& t, int64_t k) {
  if (!is_float(t.dtype())) return false;
  if (t.numel() == 1) return true;
  if (static_cast<int64_t>(t.numel()) != k || t.rank() == 0) return false;
  return t.shape().back() == k;
}

std::vector<float> times(const Tensor& t, std::span<const float> inv) {
  std::vector<float> v = t.to_f32();
  std::vector<float> out(inv.size());
  for (size_t k = 0; k < inv.size(); ++k) out[k] = v[v.size() == 1 ? 0 : k] * inv[k];
  return out;
}

Shape per_channel_shape(const Tensor& t, int64_t k) {
  return t.numel() == 1 ? Shape{k} : t.shape();
}

// Folds diag(inv) into the node producing the activation; the name of what it folded into, or
// nullopt when the producer is not one this knows to fold exactly.
std::optional<std::string> fold_into_producer(Graph& graph, size_t p, std::span<const float> inv) {
  const Node& node = graph.nodes[p];
  const auto k = static_cast<int64_t>(inv.size());
  if (!default_domain(node) || node.outputs.empty()) return std::nullopt;
  auto init = [&](size_t slot) -> const Tensor* {
    return slot < node.inputs.size() && !node.inputs[slot].empty()
               ? graph.find_initializer(node.inputs[slot])
               : nullptr;
  };
  if (node.op_type == "LayerNormalization" && node.attr_int("axis", -1) == -1) {
    const Tensor* scale = init(1);
    const bool has_bias = node.inputs.size() > 2 && !node.inputs[2].empty();
    const Tensor* bias = init(2);
    if (scale == nullptr || !per_channel_or_scalar(*scale, k) || scale->numel() != inv.size() ||
        (has_bias && (bias == nullptr || !per_channel_or_scalar(*bias, k))))
      return std::nullopt;
    const Tensor s = *scale;
    const std::optional<Tensor> b = has_bias ? std::optional<Tensor>(*bias) : std::nullopt;
    replace_constant(graph, p, 1, times(s, inv), s.shape(), s.dtype());
    if (b) replace_constant(graph, p, 2, times(*b, inv), per_channel_shape(*b, k), b->dtype());
    return graph.nodes[p].label();
  }
  if (node.op_type == "Mul" && node.inputs.size() == 2) {
    const Tensor* a = init(0);
    const Tensor* b = init(1);
    if ((a == nullptr) == (b == nullptr)) return std::nullopt;  // exactly one constant
    const size_t slot = a != nullptr ? 0 : 1;
    const Tensor c = *(a != nullptr ? a : b);
    if (!per_channel_or_scalar(c, k)) return std::nullopt;
    replace_constant(graph, p, slot, times(c, inv), per_channel_shape(c, k), c.dtype());
    return graph.nodes[p].label();
  }
  const bool gemm = node.op_type == "Gemm";
  if (node.op_type == "MatMul" || gemm) {
    const Tensor* w = init(1);
    if (w == nullptr || !is_float(w->dtype()) || w->rank() != 2 || init(0) != nullptr)
      return std::nullopt;
    const bool trans_b = gemm && node.attr_int("transB", 0) != 0;
    if ((trans_b ? w->shape()[0] : w->shape()[1]) != k) return std::nullopt;
    const bool has_bias = gemm && node.inputs.size() > 2 && !node.inputs[2].empty();
    const Tensor* bias = init(2);
    if (has_bias && (bias == nullptr || !per_channel_or_scalar(*bias, k))) return std::nullopt;
    const Tensor wt = *w;
    const std::optional<Tensor> b = has_bias ? std::optional<Tensor>(*bias) : std::nullopt;
    std::vector<float> v = wt.to_f32();
    const int64_t rows = wt.shape()[0], cols = wt.shape()[1];
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c)
        v[static_cast<size_t>(r * cols + c)] *= inv[static_cast<size_t>(trans_b ? r : c)];
    replace_constant(graph, p, 1, v, wt.shape(), wt.dtype());
    if (b) replace_constant(graph, p, 2, times(*b, inv), per_channel_shape(*b, k), b->dtype());
    return graph.nodes[p].label();
  }
  return std::nullopt;
}

bool has_subgraphs(const Graph& graph) {
  for (const Node& n : graph.nodes)
    for (const Attribute& a : n.attributes)
      if (a.g || !a.graphs.empty()) return true;
  return false;
}

}  // namespace

std::vector<float> AwqActivation::mean_abs() const {
  std::vector<float> m(sum_abs.size(), 0.0f);
  if (rows == 0) return m;
  for (size_t k = 0; k < m.size(); ++k)
    m[k] = static_cast<float>(sum_abs[k] / static_cast<double>(rows));
  return m;
}

AwqObserver::AwqObserver(const std::map<std::string, int64_t>& channels, int64_t max_rows)
    : max_rows_(max_rows) {
  if (max_rows < 1) fail_usage("awq: keep at least one calibration row per activation");
  for (const auto& [name, k] : channels) {
    AwqActivation a;
    a.channels = k;
    a.sum_abs.assign(static_cast<size_t>(k), 0.0);
    acts_.emplace(name, std::move(a));
    rngs_.emplace(name, Reservoir{});
  }
}

void AwqObserver::observe(const std::string& name, const Tensor& value) {
  const auto it = acts_.find(name);
  if (it == acts_.end() || !is_float(value.dtype()) || value.rank() == 0) return;
  AwqActivation& a = it->second;
  const int64_t k = a.channels;
  if (value.shape().back() != k) return;
  a.dtype = value.dtype();
  const std::vector<float> v = value.to_f32();
  const auto rows = static_cast<int64_t>(v.size()) / k;
  uint64_t& state = rngs_[name].state;
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = v.data() + r * k;
    for (int64_t c = 0; c < k; ++c) a.sum_abs[static_cast<size_t>(c)] += std::fabs(row[c]);
    // Reservoir sampling (Algorithm R) over the rows in data-set order.
    const uint64_t seen = a.rows++;
    if (static_cast<int64_t>(seen) < max_rows_) {
      a.sample.insert(a.sample.end(), row, row + k);
    } else {
      const uint64_t j = splitmix64(state) % (seen + 1);
      if (static_cast<int64_t>(j) < max_rows_)
        std::copy(row, row + k, a.sample.begin() + static_cast<int64_t>(j) * k);
    }
  }
}

std::map<std::string, int64_t> awq_activation_channels(const Graph& graph,
                                                       std::span<const W4A16Target> targets) {
  std::map<std::string, int64_t> out;
  std::set<std::string> conflicting;
  for (const W4A16Target& t : targets) {
    const auto a = activation_of(graph, t);
    const Tensor* w = graph.find_initializer(t.weight);
    if (!a || w == nullptr || w->rank() != 2) continue;
    const int64_t k = w->shape()[static_cast<size_t>(t.axis)];
    const auto [it, added] = out.emplace(*a, k);
    if (!added && it->second != k) conflicting.insert(*a);
  }
  for (const std::string& c : conflicting) out.erase(c);
  return out;
}

std::optional<std::string> awq_activation_of(const Graph& graph, const W4A16Target& target) {
  return activation_of(graph, target);
}

AwqCalibration collect_awq_calibration(const Graph& graph, BatchSource& data,
                                       std::span<const W4A16Target> targets,
                                       const AwqOptions& options, int threads,
                                       const std::string& mask_input, PassReport& report) {
  report.pass = "awq-calibrate";
  AwqObserver observer(awq_activation_channels(graph, targets), options.max_rows);
  auto calib = collect_activations<AwqCalibration>(graph, data, threads, mask_input, observer, report);
  report.stats["max_rows"] = options.max_rows;
  spdlog::info("awq: {} activations over {} samples, {:.2f} s",
               report.stats["activations"].get<int64_t>(), calib.samples, report.seconds);
  return calib;
}

void apply_awq(Graph& graph, std::span<const W4A16Target> targets, const AwqCalibration& calib,
               const AwqOptions& options, PassReport& report) {
  if (options.grid < 1) fail_usage("awq: the alpha grid needs at least one point");
  const Device device = resolve_device(options.device);
  // Device buffers for the whole pass: every activation's grid reuses them.
  KernelWorkspace workspace;
  KernelWorkspace* const device_workspace = device == Device::Cpu ? nullptr : &workspace;
  const auto consumers = graph.consumers();
  const auto producers = graph.producers();
  const bool subgraphs = has_subgraphs(graph);
  std::unordered_set<std::string> outputs;
  for (const ValueInfo& v : graph.outputs) outputs.insert(v.name);

  // Targets by activation, in order of first use.
  std::vector<std::string> order;
  std::unordered_map<std::string, std::vector<W4A16Target>> by_act;
  const auto channels = awq_activation_channels(graph, targets);
  for (const W4A16Target& t : targets) {
    const auto a = activation_of(graph, t);
    if (!a || !channels.count(*a)) continue;
    if (!by_act.count(*a)) order.push_back(*a);
    by_act[*a].push_back(t);
  }
  // A weight read by nodes of another activation (tied) cannot take one activation's scales.
  std::unordered_map<std::string, std::set<std::string>> weight_acts;
  for (const auto& [act, ts] : by_act)
    for (const W4A16Target& t : ts) weight_acts[t.weight].insert(act);

  report.stats["awq"] = nlohmann::ordered_json::array();
  report.stats["awq_grid"] = options.grid;
  for (const std::string& act : order) {
    const auto c = calib.activations.find(act);
    if (c == calib.activations.end() || c->second.rows == 0 ||
        c->second.channels != channels.at(act)) {
      report.warn("awq: no calibration rows for activation '" + act +
                  "': its weights are rounded to nearest");
      report.count("awq_no_data");
      continue;
    }
    const AwqActivation& a = c->second;
    std::vector<Member> members;
    std::set<size_t> member_nodes;
    for (const W4A16Target& t : by_act[act]) {
      const auto uses = consumers.find(t.weight);
      bool own = weight_acts[t.weight].size() == 1;
      if (uses != consumers.end())
        for (size_t u : uses->second) {
          const Node& n = graph.nodes[u];
          own = own && n.inputs.size() > 1 && n.inputs[0] == act && n.inputs[1] == t.weight &&
                std::count(n.inputs.begin(), n.inputs.end(), t.weight) == 1;
        }
      const Tensor& w = *graph.find_initializer(t.weight);
      if (!own || !std::isfinite(amax(std::span<const float>(w.to_f32()), Device::Cpu))) continue;
      if (std::any_of(members.begin(), members.end(),
                      [&](const Member& m) { return m.target.weight == t.weight; })) {
        member_nodes.insert(t.node);
        continue;
      }
      Member m;
      m.target = t;
      m.w = weight_kn(w, t.axis);
      m.n = w.shape()[t.axis == 0 ? 1 : 0];
      members.push_back(std::move(m));
      member_nodes.insert(t.node);
    }
    if (members.empty()) continue;
    const Search found = search(a, members, options, device, device_workspace);
    const double alpha = static_cast<double>(found.best) / options.grid;
    nlohmann::ordered_json row;
    row["activation"] = act;
    row["weights"] = nlohmann::ordered_json::array();
    for (const Member& m : members) row["weights"].push_back(m.target.weight);
    row["channels"] = a.channels;
    row["rows"] = a.sample_rows();
    row["alpha"] = alpha;
    row["error_rtn"] = found.error_rtn;
    row["error_awq"] = found.error_best;
    std::string where = "none (alpha 0: round to nearest)";
    std::vector<Clip> clips;
    if (options.clip) {
      double before = 0.0, after = 0.0;
      int64_t clipped = 0;
      for (const Member& m : members) {
        clips.push_back(clip_search(a, found.s, m, options));
        before += clips.back().before;
        after += clips.back().after;
        clipped += clips.back().clipped;
      }
      row["clip_error_before"] = before;
      row["clip_error_after"] = after;
      row["clipped_block_columns"] = clipped;
    }
    const bool clipping =
        std::any_of(clips.begin(), clips.end(), [](const Clip& c) { return c.clipped > 0; });
    if (found.best > 0 || clipping) {
      for (size_t i = 0; i < members.size(); ++i) {
        const Member& m = members[i];
        const Tensor w = *graph.find_initializer(m.target.weight);
        std::vector<float> v = w.to_f32();
        const int64_t rows = w.shape()[0], cols = w.shape()[1];
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t col = 0; col < cols; ++col) {
            const int64_t kk = m.target.axis == 0 ? r : col, nn = m.target.axis == 0 ? col : r;
            float& x = v[static_cast<size_t>(r * cols + col)];
            x *= found.s[static_cast<size_t>(kk)];
            if (!clips.empty()) {
              const float lim =
                  clips[i].limit[static_cast<size_t>((kk / options.block_size) * m.n + nn)];
              x = std::clamp(x, -lim, lim);
            }
          }
        graph.set_initializer(m.target.weight, Tensor::from_f32(v, w.shape(), w.dtype()));
      }
      if (clipping) report.count("awq_clipped");
    }
    if (found.best > 0) {
      const int64_t k = a.channels;
      std::vector<float> inv(static_cast<size_t>(k));
      for (size_t i = 0; i < inv.size(); ++i) inv[i] = 1.0f / found.s[i];
      // Folding changes the activation for every reader: only when all of them are scaled.
      bool only_members = !subgraphs && !outputs.count(act) && producers.count(act) > 0;
      const auto readers = consumers.find(act);
      if (readers != consumers.end())
        for (size_t r : readers->second) only_members = only_members && member_nodes.count(r) > 0;
      std::optional<std::string> folded;
      if (only_members) folded = fold_into_producer(graph, producers.at(act), inv);
      if (folded) {
        where = "folded into " + *folded;
        report.count("awq_folded");
      } else {
        Node mul;
        mul.op_type = "Mul";
        mul.name = graph.unique_name(act + "_awq_Mul");
        const std::string inv_name = graph.unique_name(act + "_awq_inv_scale");
        graph.set_initializer(inv_name, Tensor::from_f32(inv, {k}, a.dtype));
        mul.inputs = {act, inv_name};
        mul.outputs = {graph.unique_name(act + "_awq")};
        for (size_t n : member_nodes) graph.nodes[n].inputs[0] = mul.outputs[0];
        graph.nodes.push_back(std::move(mul));
        where = "Mul inserted";
        report.count("awq_mul");
      }
      report.count("awq_scaled");
    }
    row["inverse_scale"] = where;
    spdlog::info(
        "awq: {} ({} weights) alpha {:.2f}, sample error {:.4g} -> {:.4g} (rtn -> awq), {}", act,
        members.size(), alpha, found.error_rtn, found.error_best, where);
    report.stats["awq"].push_back(std::move(row));
  }
}

}  // namespace qforge
