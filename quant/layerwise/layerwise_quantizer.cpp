// Layer-wise quantization: see quant/layerwise/layerwise_quantizer.h.
#include "quant/layerwise/layerwise_quantizer.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <set>

#include "ir/error.h"
#include "ir/half.h"
#include "ir/json_number.h"
#include "ir/quantized_linear.h"
#include "kernels/cpu_threads_scope.h"
#include "kernels/gemm.h"
#include "kernels/int4.h"
#include "kernels/quantize.h"
#include "quant/calib/sample_context.h"
#include "quant/calib/token_mask.h"
#include "quant/w4a16/awq.h"
#include "quant/w4a16/awq_search.h"
#include "quant/w4a16/gptq.h"
#include "quant/weights/transposed.h"
#include "runtime/executor.h"

namespace qforge {

namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}


// One batch of the calibration set between layers.
struct BatchState {
  Tensor hidden;             // f32 [b, T, hidden]
  std::vector<Tensor> side;  // side_values(), in order
  BatchSource::Feeds mask;   // {attention_mask, int64 [b, T]}
  int64_t first = 0;         // its first sample in the pass
  int64_t samples = 0;
};

struct Group {
  std::string name;
  std::string input;
  std::string norm;
  int64_t k = 0;
  std::vector<size_t> linears;
};

const Tensor& feed(const BatchSource::Feeds& feeds, std::string_view name,
                   const BatchSource& data) {
  for (const auto& [n, t] : feeds)
    if (n == name) return t;
  fail_invalid(data.source() + " serves no '" + std::string(name) +
               "'; layer-wise calibration reads token ids (input_ids and attention_mask)");
}

size_t output_index(const Executor& ex, std::string_view name, const std::string& what) {
  const auto& outs = ex.outputs();
  for (size_t i = 0; i < outs.size(); ++i)
    if (outs[i].name == name) return i;
  fail_internal(what + " has no output '" + std::string(name) + "'");
}

// Runs `ex` on the layer inputs of batch `b`.
std::vector<Tensor> run_layer(const Executor& ex, const BatchState& b,
                              const std::vector<std::string>& sides, const BatchSource& data) {
  BatchSource::Feeds feeds;
  feeds.emplace_back(std::string(kDecoderHidden), b.hidden);
  for (size_t i = 0; i < sides.size(); ++i) feeds.emplace_back(sides[i], b.side[i]);
  return run_batch(ex, feeds, data, b.first);
}

// A float scale as the folder stores it (dtype of the weight), read back as f32, kept > 0.
std::vector<float> as_stored(std::span<const float> v, DType dtype, Tensor& stored,
                             const Shape& shape) {
  std::vector<float> x(v.begin(), v.end());
  if (dtype == DType::F16)
    for (float& s : x) s = std::clamp(s, -65504.0f, 65504.0f);
  stored = Tensor::from_f32(x, shape, dtype);
  return stored.to_f32();
}

DType scale_dtype(const Tensor& weight) {
  const DType d = weight.dtype();
  return d == DType::F16 || d == DType::BF16 || d == DType::F32 ? d : DType::F32;
}

// ||X D^T|| / ||X W^T|| for X [m, k] and W, D (= W - Wq) [n, k].
double relative_output_error(std::span<const float> x, int64_t m, std::span<const float> w,
                             std::span<const float> d, int64_t n, int64_t k) {
  if (m == 0) return 0.0;
  std::vector<float> y(static_cast<size_t>(m * n)), e(y.size());
  GemmShape g;
  g.trans_b = true;
  g.m = m, g.n = n, g.k = k, g.lda = k, g.ldb = k, g.ldc = n;
  gemm_f32(cpu_threads(), g, x.data(), w.data(), y.data());
  gemm_f32(cpu_threads(), g, x.data(), d.data(), e.data());
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < y.size(); ++i) {
    num += static_cast<double>(e[i]) * e[i];
    den += static_cast<double>(y[i]) * y[i];
  }
  return den > 0.0 ? std::sqrt(num / den) : (num > 0.0 ? std::numeric_limits<double>::infinity()
                                                         : 0.0);
}

class LayerwiseRun {
 public:
  LayerwiseRun(const DecoderParts& parts, Graph& weights, BatchSource& ids,
               const LayerwiseOptions& o, LayerProgress* progress)
      : parts_(parts), weights_(weights), ids_(ids), o_(o), progress_(progress) {}

  LayerwiseResult run() {
    const auto start = Clock::now();
    check_options();
    device_ = o_.scheme == LayerwiseScheme::W4A16 && o_.method == W4Method::Awq
                  ? resolve_device(o_.device)
                  : Device::Cpu;
    scale_ = o_.scale.value_or(default_int4_scale(o_.method));
    result_.scheme = std::string(layerwise_scheme_name(o_.scheme));
    const bool w4 = o_.scheme == LayerwiseScheme::W4A16;
    result_.method = std::string(w4_method_name(w4 ? o_.method : W4Method::Rtn));
    result_.block_size = w4 ? o_.block_size : 0;
    result_.scale = w4 ? std::string(int4_scale_name(scale_)) : "";
    sides_ = parts_.side_values();
    prologue();
    const int64_t layers = parts_.num_layers();
    for (int64_t i = 0; i < layers; ++i) {
      result_.layers.push_back(layer(i));
      if (progress_ != nullptr) progress_->layer_done(result_.layers.back(), layers);
    }
    result_.seconds = since(start);
    return std::move(result_);
  }

 private:
  void check_options() const {
    const bool any_int4 =
        o_.scheme == LayerwiseScheme::W4A16 ||
        std::any_of(o_.bits.begin(), o_.bits.end(), [](const auto& b) { return b.second == 4; });
    if (any_int4 && o_.block_size != 32 && o_.block_size != 64 && o_.block_size != 128) {
      fail_usage("--block-size " + std::to_string(o_.block_size) +
                 ": layer-wise W4A16 uses 32, 64 or 128");
    }
    if (o_.sample_rows < 1) fail_usage("layer-wise: keep at least one sampled row per Linear");
    if (o_.error_samples < 0) fail_usage("layer-wise: error samples must be 0 (all) or more");
    if (o_.awq_grid < 1) fail_usage("awq: the alpha grid needs at least one point");
    if (o_.threads < 0) fail_usage("--threads " + std::to_string(o_.threads) + ": use 0 or more");
  }

  // 4, 8 or 0 (float) for a Linear weight: LayerwiseOptions::bits, else the scheme's.
  int bits_of(const std::string& weight) const {
    const auto it = o_.bits.find(weight);
    if (it != o_.bits.end()) return it->second;
    return o_.scheme == LayerwiseScheme::W4A16 ? 4 : 8;
  }

  bool all_int4(const std::vector<DecoderLinear>& lins, const Group& gr) const {
    return std::all_of(gr.linears.begin(), gr.linears.end(),
                       [&](size_t li) { return bits_of(lins[li].weight) == 4; });
  }

  ExecutorOptions exec_options() const { return ExecutorOptions{Device::Cpu, o_.threads}; }

  void prologue() {
    const auto start = Clock::now();
    const Graph g = parts_.prologue();
    Executor ex(g, exec_options());
    const size_t hidden_at = output_index(ex, kDecoderHidden, "the prologue");
    std::vector<size_t> side_at;
    for (const std::string& s : sides_) side_at.push_back(output_index(ex, s, "the prologue"));
    ids_.rewind();
    BatchSource::Feeds batch;
    int64_t served = 0, tokens = 0;
    while (ids_.next(batch)) {
      BatchSource::Feeds feeds;
      feeds.emplace_back(std::string(kDecoderInputIds), feed(batch, kDecoderInputIds, ids_));
      const Tensor& mask = feed(batch, kDecoderAttentionMask, ids_);
      feeds.emplace_back(std::string(kDecoderAttentionMask), mask);
      std::vector<Tensor> out = run_batch(ex, feeds, ids_, served);
      BatchState b;
      b.hidden = std::move(out[hidden_at]);
      if (b.hidden.dtype() != DType::F32 || b.hidden.rank() != 3) {
        fail_internal("the prologue's hidden_states is " +
                      std::string(dtype_name(b.hidden.dtype())) + " " +
                      shape_to_string(b.hidden.shape()) + ", not f32 [B, T, hidden]");
      }
      for (size_t at : side_at) b.side.push_back(std::move(out[at]));
      b.mask.emplace_back(std::string(kDecoderAttentionMask), mask);
      b.first = served;
      b.samples = batch_samples(feeds);
      tokens += TokenMask(b.mask, std::string(kDecoderAttentionMask)).real();
      served += b.samples;
      batches_.push_back(std::move(b));
    }
    if (batches_.empty()) fail_invalid(ids_.source() + " serves no samples");
    result_.samples = served;
    result_.tokens = tokens;
    result_.seq_len = batches_.front().hidden.shape()[1];
    result_.dataset_digest = ids_.digest();
    result_.prologue_seconds = since(start);
    spdlog::info("layer-wise: prologue over {} samples ({} tokens), {:.2f} s", served, tokens,
                 result_.prologue_seconds);
    if (progress_ != nullptr) progress_->prologue_done(served, tokens, result_.prologue_seconds);
  }

  std::vector<Group> groups_of(const Graph& g, const std::vector<DecoderLinear>& lins,
                               int64_t index) const {
    std::vector<Group> groups;
    std::set<std::string> seen_weights;
    for (size_t i = 0; i < lins.size(); ++i) {
      const DecoderLinear& l = lins[i];
      const std::string what = "layer " + std::to_string(index) + " Linear '" + l.weight + "'";
      const Tensor* t = g.find_initializer(l.weight);
      if (t == nullptr) fail_internal(what + " is no initializer of the layer graph");
      if (t->rank() != 2 || t->shape()[0] != l.out_features || t->shape()[1] != l.in_features) {
        fail_internal(what + " is " + shape_to_string(t->shape()) + ", not [" +
                      std::to_string(l.out_features) + ", " + std::to_string(l.in_features) + "]");
      }
      if (weights_.find_initializer(l.weight) == nullptr) {
        fail_internal(what + " is not in the model folder's weights");
      }
      if (!seen_weights.insert(l.weight).second) fail_internal(what + " is listed twice");
      if (bits_of(l.weight) == 4 && l.in_features % o_.block_size != 0) {
        fail_usage(what + " has " + std::to_string(l.in_features) +
                   " inputs, not a multiple of block size " + std::to_string(o_.block_size) +
                   "; choose a block size that divides it");
      }
      auto it = std::find_if(groups.begin(), groups.end(),
                             [&](const Group& gr) { return gr.input == l.input; });
      if (it == groups.end()) {
        groups.push_back(Group{l.group.empty() ? l.input : l.group, l.input, l.norm,
                               l.in_features, {}});
        it = groups.end() - 1;
      }
      if (it->k != l.in_features) fail_internal(what + ": its group reads another width");
      it->linears.push_back(i);
    }
    return groups;
  }

  LayerResult layer(int64_t index) {
    const auto start = Clock::now();
    LayerResult out;
    out.index = index;
    Graph g = parts_.layer(index);
    const std::vector<DecoderLinear> lins = parts_.linears(index);
    const std::vector<Group> groups = groups_of(g, lins, index);
    std::map<std::string, int64_t> channels;
    for (const Group& gr : groups) channels[gr.input] = gr.k;

    // 1. The float layer over the data: sample rows, H, float outputs.
    auto t0 = Clock::now();
    AwqObserver sampler(channels, o_.sample_rows);
    const bool gptq = o_.scheme == LayerwiseScheme::W4A16 && o_.method == W4Method::Gptq;
    std::optional<GptqObserver> hessian;
    if (gptq) hessian.emplace(channels);
    std::vector<Tensor> float_out(batches_.size());
    {
      Executor ex(g, exec_options());
      const size_t y_at = output_index(ex, kDecoderLayerOutput, "layer " + std::to_string(index));
      std::optional<TokenMask> mask;
      ex.set_observer([&](const std::string& name, const Tensor& value) {
        if (!channels.count(name)) return;
        const Tensor v = mask && mask->covers(value) ? mask->real_rows(value) : value;
        sampler.observe(name, v);
        if (hessian) hessian->observe(name, v);
      });
      int64_t kept = 0;
      for (size_t b = 0; b < batches_.size(); ++b) {
        mask.reset();
        TokenMask m(batches_[b].mask, std::string(kDecoderAttentionMask));
        if (!m.all_real()) mask = std::move(m);
        std::vector<Tensor> y = run_layer(ex, batches_[b], sides_, ids_);
        if (o_.error_samples == 0 || kept < o_.error_samples) {
          float_out[b] = std::move(y[y_at]);
          kept += batches_[b].samples;
        }
      }
      ex.set_observer(nullptr);
    }
    out.observe_seconds = since(t0);

    // 2. Quantize, group by group; the layer graph gets the dequantized weights.
    t0 = Clock::now();
    out.linears.resize(lins.size());
    if (o_.scheme == LayerwiseScheme::W4A16 && o_.method == W4Method::Awq) {
      for (const Group& gr : groups) fold_into_producer(g, lins, gr, sampler);
    }
    for (const Group& gr : groups) quantize_group(g, lins, gr, sampler, hessian, out);
    producer_scales_.clear();
    out.quantize_seconds = since(t0);

    // 3. The quantized layer over the data: the next layer's inputs and the layer error.
    t0 = Clock::now();
    {
      Executor ex(g, exec_options());
      const size_t y_at = output_index(ex, kDecoderLayerOutput, "layer " + std::to_string(index));
      double num = 0.0, den = 0.0;
      for (size_t b = 0; b < batches_.size(); ++b) {
        std::vector<Tensor> y = run_layer(ex, batches_[b], sides_, ids_);
        Tensor& yq = y[y_at];
        if (!float_out[b].empty()) {
          const TokenMask m(batches_[b].mask, std::string(kDecoderAttentionMask));
          const std::vector<float> q = m.real_rows(yq).to_f32();
          const std::vector<float> f = m.real_rows(float_out[b]).to_f32();
          for (size_t i = 0; i < q.size(); ++i) {
            const double d = static_cast<double>(q[i]) - f[i];
            num += d * d;
            den += static_cast<double>(f[i]) * f[i];
          }
          out.error_tokens += m.real();
          float_out[b] = Tensor();
        }
        batches_[b].hidden = std::move(yq);
      }
      out.output_error = den > 0.0 ? std::sqrt(num / den) : 0.0;
    }
    out.forward_seconds = since(t0);
    out.seconds = since(start);
    return out;
  }

  void quantize_group(Graph& g, const std::vector<DecoderLinear>& lins, const Group& gr,
                      const AwqObserver& sampler, const std::optional<GptqObserver>& hessian,
                      LayerResult& out) {
    const AwqActivation& act = sampler.activations().at(gr.input);
    const int64_t k = gr.k;
    // The group's weights [N, K] as f32, checked finite.
    std::vector<std::vector<float>> w;
    for (size_t li : gr.linears) {
      const DecoderLinear& l = lins[li];
      w.push_back(g.find_initializer(l.weight)->to_f32());
      if (!std::isfinite(amax(std::span<const float>(w.back()), Device::Cpu))) {
        fail_invalid("weight '" + l.weight +
                     "' holds NaN or Inf; fix the model folder before quantizing it");
      }
    }
    std::vector<float> s(static_cast<size_t>(k), 1.0f);  // AWQ's input scales
    std::vector<std::vector<float>> wkn;                 // [K, N], as the int4 kernels block
    for (size_t i = 0; i < w.size(); ++i)
      wkn.push_back(transposed(std::span<const float>(w[i]), lins[gr.linears[i]].out_features, k));
    // AWQ's clip search with AwqOptions::clip_scales: each member's chosen block scales
    // [blocks, N] (fp16 bits), empty where it had none (q/k, or no search).
    std::vector<std::vector<uint16_t>> chosen(w.size());

    if (o_.scheme == LayerwiseScheme::W4A16 && o_.method == W4Method::Awq && act.rows > 0 &&
        all_int4(lins, gr))
      awq_prepare(g, lins, gr, act, wkn, s, chosen, out);

    for (size_t i = 0; i < gr.linears.size(); ++i) {
      const DecoderLinear& l = lins[gr.linears[i]];
      const int64_t n = l.out_features;
      const Tensor& original = *weights_.find_initializer(l.weight);
      const DType sdt = scale_dtype(original);
      std::vector<float> deq(static_cast<size_t>(n * k));  // [N, K]
      const int bits = bits_of(l.weight);
      if (bits == 0) {  // left float: the layer and the folder keep the weight as it is
        deq = w[i];
      } else if (bits == 8) {
        std::vector<float> am(static_cast<size_t>(n));
        amax_per_channel(w[i], 1, n, k, am, Device::Cpu);
        std::vector<float> sc(am.size());
        for (size_t c = 0; c < am.size(); ++c) {
          sc[c] = int8_symmetric_scale(am[c]);
          // on fp16's grid (never 0) when the layout stores fp16 scales
          if (o_.fp16_scales) {
            sc[c] = std::max(f16_to_f32(f32_to_f16(std::min(sc[c], 65504.0f))),
                             std::ldexp(1.0f, -24));
          }
        }
        Tensor scale;
        std::vector<float> stored = as_stored(sc, sdt, scale, {n});
        for (float& v : stored)
          if (!(v > 0.0f) || !std::isfinite(v)) v = std::numeric_limits<float>::min();
        scale = Tensor::from_f32(stored, {n}, sdt);
        stored = scale.to_f32();
        Tensor q(DType::I8, {n, k});
        quantize_int8(w[i], 1, n, k, stored, q.mutable_data<int8_t>(), Device::Cpu);
        dequantize_int8(q.data<int8_t>(), 1, n, k, stored, deq, Device::Cpu);
        store_quantized_linear(weights_, l.weight, std::move(q), std::move(scale), 0);
      } else {
        const int64_t bs = o_.block_size, blocks = k / bs;
        std::vector<int8_t> qkn(static_cast<size_t>(k * n));
        std::vector<uint16_t> s16(static_cast<size_t>(blocks * n));  // [blocks, N]
        if (o_.method == W4Method::Gptq && hessian &&
            hessian->activations().at(gr.input).rows > 0) {
          GptqOptions go;
          go.block_size = o_.block_size;
          go.scale = scale_;
          go.damp = o_.gptq_damp;
          gptq_quantize(wkn[i], k, n, hessian->activations().at(gr.input).h, go, qkn, s16);
        } else if (!chosen[i].empty()) {  // AWQ's clip search chose the block scales
          s16 = std::move(chosen[i]);
          for (int64_t r = 0; r < k; ++r)
            for (int64_t c = 0; c < n; ++c) {
              const auto at = static_cast<size_t>(r * n + c);
              const float sc = f16_to_f32(s16[static_cast<size_t>((r / bs) * n + c)]);
              const float q = std::clamp(std::nearbyint(wkn[i][at] / sc), -8.0f, 7.0f);
              qkn[at] = static_cast<int8_t>(q);
            }
        } else {
          std::vector<uint8_t> packed(static_cast<size_t>(int4_packed_bytes(k * n)));
          quantize_int4_blocked(wkn[i], k, n, bs, s16, packed, device_, scale_);
          unpack_int4(packed, qkn);
        }
        std::vector<float> sc(s16.size());
        std::transform(s16.begin(), s16.end(), sc.begin(), f16_to_f32);
        Tensor scale;
        const std::vector<float> stored =
            as_stored(transposed(std::span<const float>(sc), blocks, n), sdt, scale, {n, blocks});
        const std::vector<int8_t> qnk = transposed(std::span<const int8_t>(qkn), k, n);
        for (int64_t r = 0; r < n; ++r)
          for (int64_t c = 0; c < k; ++c) {
            const auto at = static_cast<size_t>(r * k + c);
            deq[at] = static_cast<float>(qnk[at]) * stored[static_cast<size_t>(r * blocks + c / bs)];
          }
        Tensor q(DType::I4, {n, k});
        pack_int4(qnk, q.mutable_data<uint8_t>());
        store_quantized_linear(weights_, l.weight, std::move(q), std::move(scale), bs);
      }
      // The layer computes with the dequantized weight from now on.
      if (bits != 0) {
        const Tensor& lt = *g.find_initializer(l.weight);
        g.set_initializer(l.weight, Tensor::from_f32(deq, lt.shape(), lt.dtype()));
      }

      // The error proxy, in the float layer's input space (AWQ: 1/s folded back in).
      std::vector<float> d(deq.size());
      for (int64_t r = 0; r < n; ++r)
        for (int64_t c = 0; c < k; ++c) {
          const auto at = static_cast<size_t>(r * k + c);
          d[at] = w[i][at] - deq[at] / s[static_cast<size_t>(c)];
        }
      LinearResult& lr = out.linears[gr.linears[i]];
      lr.weight = l.weight;
      lr.group = gr.name;
      lr.out_features = n;
      lr.in_features = k;
      lr.output_error = relative_output_error(act.sample, act.sample_rows(), w[i], d, n, k);
    }
  }

  AwqOptions awq_options() const {
    AwqOptions ao;
    ao.block_size = o_.block_size;
    ao.grid = o_.awq_grid;
    ao.duo = o_.awq_duo;
    ao.max_rows = o_.sample_rows;
    ao.clip = o_.awq_clip;
    ao.clip_scales = scale_ == Int4Scale::Amax;
    ao.device = device_;
    ao.scale = scale_;
    return ao;
  }

  AwqScaleSearch search_scales(const AwqActivation& act, std::span<const AwqMember> members,
                               const AwqOptions& ao) const {
    KernelWorkspace workspace;
    return awq_search_scales(act, members, ao, device_,
                             device_ == Device::Cpu ? nullptr : &workspace);
  }

  // AWQ's scale search for a group whose input channels are another Linear's output rows
  // (DecoderLinear::producer): 1/s goes into those rows (and their bias) before anything of the
  // layer is quantized, as AutoAWQ scales up_proj for down_proj. The float layer computes the
  // same function; the group then quantizes W * s with these scales (awq_prepare).
  void fold_into_producer(Graph& g, const std::vector<DecoderLinear>& lins, const Group& gr,
                          const AwqObserver& sampler) {
    const std::string& producer = lins[gr.linears.front()].producer;
    if (producer.empty() || !all_int4(lins, gr) || bits_of(producer) != 4) return;
    const auto p = std::find_if(lins.begin(), lins.end(),
                                [&](const DecoderLinear& l) { return l.weight == producer; });
    if (p == lins.end() || p->out_features != gr.k || p->input == gr.input) return;
    const AwqActivation& act = sampler.activations().at(gr.input);
    if (act.rows == 0) return;
    const int64_t k = gr.k;
    std::vector<AwqMember> members;
    for (size_t li : gr.linears) {
      const DecoderLinear& l = lins[li];
      const std::vector<float> w = g.find_initializer(l.weight)->to_f32();
      members.push_back(AwqMember{transposed(std::span<const float>(w), l.out_features, k),
                                  l.out_features});
    }
    AwqScaleSearch found = search_scales(act, members, awq_options());
    if (found.best == 0) return;
    auto divide_rows = [&](const std::string& name, int64_t cols) {
      const Tensor& t = *g.find_initializer(name);
      std::vector<float> v = t.to_f32();
      for (int64_t r = 0; r < k; ++r)
        for (int64_t c = 0; c < cols; ++c) v[static_cast<size_t>(r * cols + c)] /= found.s[r];
      g.set_initializer(name, Tensor::from_f32(v, t.shape(), t.dtype()));
    };
    divide_rows(p->weight, p->in_features);  // quantized from the layer graph's copy
    if (!p->bias.empty()) {  // stays float: written back into the folder's tensors too
      divide_rows(p->bias, 1);
      const Tensor& stored = *weights_.find_initializer(p->bias);
      weights_.set_initializer(p->bias, Tensor::from_f32(g.find_initializer(p->bias)->to_f32(),
                                                         stored.shape(), stored.dtype()));
    }
    producer_scales_[gr.input] = std::move(found);
  }

  // AWQ on one group: the scale search (groups with a norm to fold 1/s into), the clip search,
  // and the float weights (wkn) rewritten as apply_awq rewrites them: scaled, and clamped to the
  // clip limits, or (clip_scales) left unclamped with the chosen block scales in `chosen`.
  void awq_prepare(Graph& g, const std::vector<DecoderLinear>& lins, const Group& gr,
                   const AwqActivation& act, std::vector<std::vector<float>>& wkn,
                   std::vector<float>& s, std::vector<std::vector<uint16_t>>& chosen,
                   LayerResult& out) {
    const AwqOptions ao = awq_options();
    std::vector<AwqMember> members;
    const int64_t k = gr.k;
    for (auto& v : wkn) members.push_back(AwqMember{v, static_cast<int64_t>(v.size()) / k});
    const Tensor* norm = gr.norm.empty() ? nullptr : g.find_initializer(gr.norm);
    const Tensor* stored_norm = gr.norm.empty() ? nullptr : weights_.find_initializer(gr.norm);
    const bool can_fold = norm != nullptr && stored_norm != nullptr &&
                          static_cast<int64_t>(norm->numel()) == k &&
                          static_cast<int64_t>(stored_norm->numel()) == k &&
                          !folded_.count(gr.norm);
    int best = 0;
    double alpha = 0.0;
    const auto preset = producer_scales_.find(gr.input);
    if (preset != producer_scales_.end()) {  // already folded into the producer's rows
      s = preset->second.s;
      alpha = preset->second.alpha;
    } else if (can_fold) {
      const AwqScaleSearch found = search_scales(act, members, ao);
      if (found.best > 0) {
        best = found.best;
        alpha = found.alpha;
        s = found.s;
      }
    }
    std::vector<AwqClip> clips;
    if (o_.awq_clip)
      for (size_t i = 0; i < members.size(); ++i) {
        if (lins[gr.linears[i]].attention_scores) {  // left unclipped (DecoderLinear)
          AwqClip none;
          none.limit.assign(members[i].w.size() / static_cast<size_t>(o_.block_size),
                            std::numeric_limits<float>::infinity());
          clips.push_back(std::move(none));
          continue;
        }
        clips.push_back(awq_search_clip(act, s, members[i], ao));
      }
    for (size_t i = 0; i < wkn.size(); ++i) {
      const int64_t n = members[i].n;
      for (int64_t r = 0; r < k; ++r)
        for (int64_t c = 0; c < n; ++c) {
          float& x = wkn[i][static_cast<size_t>(r * n + c)];
          x *= s[static_cast<size_t>(r)];
          if (!clips.empty() && clips[i].scale.empty()) {
            const float lim = clips[i].limit[static_cast<size_t>((r / o_.block_size) * n + c)];
            x = std::clamp(x, -lim, lim);
          }
        }
    }
    for (size_t i = 0; i < clips.size(); ++i) chosen[i] = std::move(clips[i].scale);
    for (size_t i = 0; i < gr.linears.size(); ++i) {
      LinearResult& lr = out.linears[gr.linears[i]];
      lr.alpha = alpha;
      lr.clipped = clips.empty() ? 0 : clips[i].clipped;
    }
    if (best == 0) return;
    auto fold = [&](const Tensor& t) {
      std::vector<float> v = t.to_f32();
      for (size_t c = 0; c < v.size(); ++c) v[c] /= s[c];
      return Tensor::from_f32(v, t.shape(), t.dtype());
    };
    Tensor folded_layer = fold(*norm);
    Tensor folded_stored = fold(*stored_norm);
    g.set_initializer(gr.norm, std::move(folded_layer));
    weights_.set_initializer(gr.norm, std::move(folded_stored));
    folded_.insert(gr.norm);
    out.folded_norms.push_back(gr.norm);
  }

  const DecoderParts& parts_;
  Graph& weights_;
  BatchSource& ids_;
  const LayerwiseOptions& o_;
  LayerProgress* progress_;
  Device device_ = Device::Cpu;
  Int4Scale scale_ = Int4Scale::Mse;
  std::vector<std::string> sides_;
  std::vector<BatchState> batches_;
  std::set<std::string> folded_;
  std::map<std::string, AwqScaleSearch> producer_scales_;  // this layer's, by group input
  LayerwiseResult result_;
};

}  // namespace

std::string_view layerwise_scheme_name(LayerwiseScheme scheme) {
  return scheme == LayerwiseScheme::Int8PerChannel ? "int8-weights" : "w4a16";
}

LayerwiseResult quantize_layerwise(const DecoderParts& parts, Graph& weights, BatchSource& ids,
                                   const LayerwiseOptions& options, LayerProgress* progress) {
  const CpuThreadsScope threads(options.threads);
  return LayerwiseRun(parts, weights, ids, options, progress).run();
}

nlohmann::ordered_json layerwise_result_json(const LayerwiseResult& r) {
  using J = nlohmann::ordered_json;
  J j;
  j["scheme"] = r.scheme;
  j["method"] = r.method;
  if (r.block_size > 0) j["block_size"] = r.block_size;
  if (!r.scale.empty()) j["scale"] = r.scale;
  j["samples"] = r.samples;
  j["tokens"] = r.tokens;
  j["seq_len"] = r.seq_len;
  j["dataset_digest"] = r.dataset_digest;
  j["prologue_seconds"] = r.prologue_seconds;
  j["seconds"] = r.seconds;
  j["layers"] = J::array();
  for (const LayerResult& l : r.layers) {
    J lj;
    lj["index"] = l.index;
    lj["seconds"] = l.seconds;
    lj["observe_seconds"] = l.observe_seconds;
    lj["quantize_seconds"] = l.quantize_seconds;
    lj["forward_seconds"] = l.forward_seconds;
    lj["output_error"] = json_number<J>(l.output_error);
    lj["error_tokens"] = l.error_tokens;
    if (!l.folded_norms.empty()) lj["folded_norms"] = l.folded_norms;
    lj["linears"] = J::array();
    for (const LinearResult& x : l.linears) {
      J xj;
      xj["weight"] = x.weight;
      xj["group"] = x.group;
      xj["shape"] = {x.out_features, x.in_features};
      xj["output_error"] = json_number<J>(x.output_error);
      if (r.method == "awq") {
        xj["alpha"] = x.alpha;
        xj["clipped_block_columns"] = x.clipped;
      }
      lj["linears"].push_back(std::move(xj));
    }
    j["layers"].push_back(std::move(lj));
  }
  return j;
}

std::string layerwise_progress_line(const LayerResult& layer, int64_t num_layers) {
  const LinearResult* worst = nullptr;
  for (const LinearResult& l : layer.linears)
    if (worst == nullptr || l.output_error > worst->output_error) worst = &l;
  char buf[160];
  std::snprintf(buf, sizeof buf, "layer %lld/%lld  %.2f s  output error %.4g",
                static_cast<long long>(layer.index + 1), static_cast<long long>(num_layers),
                layer.seconds, layer.output_error);
  std::string line = buf;
  if (worst != nullptr) {
    std::snprintf(buf, sizeof buf, " (worst %s %.4g)", worst->weight.c_str(), worst->output_error);
    line += buf;
  }
  return line;
}

}  // namespace qforge
