#include "quant/layerwise/layerwise_quantizer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "ir/error.h"
#include "ir/half.h"
#include "kernels/device.h"
#include "kernels/int4.h"
#include "kernels/quantize.h"
#include "quant/calib/token_mask.h"
#include "quant/w4a16/gptq.h"
#include "quant/weights/transposed.h"
#include "runtime/executor.h"
#include "tests/unit/quant/layerwise/tiny_decoder.h"

namespace qforge {
namespace {

using test::layerwise::kHidden;
using test::layerwise::kInter;
using test::layerwise::lname;
using test::layerwise::TinyDecoder;
using test::layerwise::tiny_weights;
using test::layerwise::token_batches;

constexpr int64_t kLayers = 3;
const std::vector<int64_t> kLengths = {12, 7, 9, 12, 3, 10, 12, 5, 8, 11, 12, 6, 4, 12, 9, 12};

struct Quantized {
  Graph weights;
  LayerwiseResult result;
};

Quantized run(const LayerwiseOptions& o, std::vector<BatchSource::Feeds> batches) {
  Quantized r;
  r.weights = tiny_weights(kLayers);
  const Graph float_weights = tiny_weights(kLayers);
  TinyDecoder parts(float_weights, kLayers);
  MemoryBatches data(std::move(batches), "tiny ids");
  r.result = quantize_layerwise(parts, r.weights, data, o);
  return r;
}

std::vector<BatchSource::Feeds> default_batches(int64_t pad_id = 0, int64_t t = 12) {
  return token_batches(kLengths, t, 4, pad_id);
}

LayerwiseOptions w4(W4Method method, int block = 32) {
  LayerwiseOptions o;
  o.method = method;
  o.block_size = block;
  o.device = Device::Cpu;
  o.error_samples = 0;
  return o;
}

// A stored Linear as float [out, in]: q * scale.
std::vector<float> dequantized(const Graph& g, const std::string& name) {
  const Tensor& q = *g.find_initializer(name);
  const Tensor& s = *g.find_initializer(name + "_scale");
  const std::vector<float> qv = q.to_f32(), sv = s.to_f32();
  const int64_t n = q.shape()[0], k = q.shape()[1];
  std::vector<float> out(qv.size());
  const int64_t per = s.rank() == 1 ? k : k / s.shape()[1];
  const int64_t blocks = s.rank() == 1 ? 1 : s.shape()[1];
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < k; ++c)
      out[static_cast<size_t>(r * k + c)] =
          qv[static_cast<size_t>(r * k + c)] * sv[static_cast<size_t>(r * blocks + c / per)];
  return out;
}

std::vector<std::string> all_linears() {
  std::vector<std::string> out;
  const Graph w = tiny_weights(kLayers);
  TinyDecoder parts(w, kLayers);
  for (int64_t i = 0; i < kLayers; ++i)
    for (const DecoderLinear& l : parts.linears(i)) out.push_back(l.weight);
  return out;
}

double mean_layer_error(const LayerwiseResult& r) {
  double sum = 0.0;
  for (const LayerResult& l : r.layers) sum += l.output_error;
  return sum / static_cast<double>(r.layers.size());
}

// The model whose quantized Linears are dequantized from `q` (its other tensors, AWQ's folded
// norms included, taken from it) against the float model, run whole: relative error of the
// logits, then of each layer's output at the real tokens.
std::vector<double> model_errors(const Graph& q) {
  Graph fq = tiny_weights(kLayers);
  for (const auto& [name, t] : q.initializers()) {
    if (q.find_quant_record(name) != nullptr) {
      fq.set_initializer(name, Tensor::from_f32(dequantized(q, name), t.shape()));
    } else if (fq.has_initializer(name)) {
      fq.set_initializer(name, t);
    }
  }
  const Graph fw = tiny_weights(kLayers);
  const TinyDecoder fparts(fw, kLayers), qparts(fq, kLayers);
  Executor fe(fparts.whole_with(true)), qe(qparts.whole_with(true));
  // Outputs: logits, then layers.<i>.input for i = 0..2 (layer i - 1's output).
  std::vector<double> num(kLayers + 1, 0.0), den(kLayers + 1, 0.0);
  for (const BatchSource::Feeds& b : default_batches()) {
    const std::vector<Tensor> yf = fe.run(b), yq = qe.run(b);
    const TokenMask mask(b, "attention_mask");
    for (size_t i = 0; i < yf.size(); ++i) {
      const std::vector<float> f = i == 0 ? yf[i].to_f32() : mask.real_rows(yf[i]).to_f32();
      const std::vector<float> x = i == 0 ? yq[i].to_f32() : mask.real_rows(yq[i]).to_f32();
      for (size_t j = 0; j < f.size(); ++j) {
        num[i] += (x[j] - f[j]) * (x[j] - f[j]);
        den[i] += f[j] * f[j];
      }
    }
  }
  std::vector<double> out;
  for (size_t i = 0; i < num.size(); ++i) out.push_back(std::sqrt(num[i] / den[i]));
  return out;
}

TEST(Layerwise, RtnEqualsRoundToNearestOfEachWeight) {
  const Quantized r = run(w4(W4Method::Rtn), default_batches());
  const Graph original = tiny_weights(kLayers);
  ASSERT_EQ(r.result.layers.size(), static_cast<size_t>(kLayers));
  for (const std::string& name : all_linears()) {
    SCOPED_TRACE(name);
    const Tensor& w = *original.find_initializer(name);
    const int64_t n = w.shape()[0], k = w.shape()[1];
    const std::vector<float> wkn = transposed(std::span<const float>(w.to_f32()), n, k);
    std::vector<uint16_t> scales(static_cast<size_t>(int4_block_count(k, 32) * n));
    std::vector<uint8_t> packed(static_cast<size_t>(int4_packed_bytes(k * n)));
    quantize_int4_blocked(wkn, k, n, 32, scales, packed, Device::Cpu, Int4Scale::Mse);
    std::vector<int8_t> q(static_cast<size_t>(k * n));
    unpack_int4(packed, q);
    const std::vector<int8_t> qnk = transposed(std::span<const int8_t>(q), k, n);
    const Tensor& stored = *r.weights.find_initializer(name);
    ASSERT_EQ(stored.dtype(), DType::I4);
    ASSERT_EQ(stored.shape(), (Shape{n, k}));
    std::vector<int8_t> got(static_cast<size_t>(n * k));
    unpack_int4(stored.data<uint8_t>(), got);
    EXPECT_EQ(got, qnk);
    const Tensor& s = *r.weights.find_initializer(name + "_scale");
    ASSERT_EQ(s.shape(), (Shape{n, k / 32}));
    const std::vector<float> sv = s.to_f32();
    for (int64_t c = 0; c < n; ++c)
      for (int64_t b = 0; b < k / 32; ++b)
        ASSERT_EQ(sv[static_cast<size_t>(c * (k / 32) + b)],
                  f16_to_f32(scales[static_cast<size_t>(b * n + c)]));
    const QuantRecord* rec = r.weights.find_quant_record(name);
    ASSERT_NE(rec, nullptr);
    EXPECT_EQ(rec->block_size, 32);
  }
  // Norms and embeddings are left alone.
  EXPECT_TRUE(r.weights.find_initializer(lname(0, "input_layernorm.weight"))
                  ->equals(*original.find_initializer(lname(0, "input_layernorm.weight"))));
  EXPECT_EQ(r.weights.find_initializer("lm_head.weight")->dtype(), DType::F32);
  for (const LayerResult& l : r.result.layers) {
    EXPECT_GT(l.output_error, 0.0);
    EXPECT_LT(l.output_error, 0.5);
    for (const LinearResult& x : l.linears) EXPECT_GT(x.output_error, 0.0);
  }
}

TEST(Layerwise, GptqAndAwqLowerTheLayerErrorBelowRtn) {
  for (int block : {32, 64}) {
    SCOPED_TRACE(block);
    const Quantized rtn = run(w4(W4Method::Rtn, block), default_batches());
    const Quantized gptq = run(w4(W4Method::Gptq, block), default_batches());
    const Quantized awq = run(w4(W4Method::Awq, block), default_batches());
    const double e_rtn = mean_layer_error(rtn.result), e_gptq = mean_layer_error(gptq.result),
                 e_awq = mean_layer_error(awq.result);
    std::printf("block %d: mean layer output error rtn %.5f gptq %.5f awq %.5f\n", block, e_rtn,
                e_gptq, e_awq);
    for (size_t i = 0; i < rtn.result.layers.size(); ++i) {
      std::printf("  layer %zu: rtn %.5f gptq %.5f awq %.5f\n", i,
                  rtn.result.layers[i].output_error, gptq.result.layers[i].output_error,
                  awq.result.layers[i].output_error);
    }
    EXPECT_LT(e_gptq, e_rtn);
    EXPECT_LT(e_awq, e_rtn);
  }
}

TEST(Layerwise, AwqFoldsItsScalesIntoTheNorms) {
  const Quantized awq = run(w4(W4Method::Awq), default_batches());
  const Graph original = tiny_weights(kLayers);
  int64_t folded = 0;
  for (const LayerResult& l : awq.result.layers) {
    for (const std::string& norm : l.folded_norms) {
      ++folded;
      EXPECT_FALSE(awq.weights.find_initializer(norm)->equals(*original.find_initializer(norm)));
    }
  }
  EXPECT_GT(folded, 0);
  // What the quantizer computed with is what it wrote: the whole model rebuilt from `weights`
  // (dequantized Linears, folded norms) gives layer 0's output error exactly (layer 0 sees the
  // same inputs in both), and AWQ's is below RTN's.
  const Quantized rtn = run(w4(W4Method::Rtn), default_batches());
  const Quantized gptq = run(w4(W4Method::Gptq), default_batches());
  const std::vector<double> e_awq = model_errors(awq.weights), e_rtn = model_errors(rtn.weights),
                            e_gptq = model_errors(gptq.weights);
  std::printf("whole model, block 32: layer-0 output error rtn %.5f gptq %.5f awq %.5f; "
              "layer-2 input rtn %.5f gptq %.5f awq %.5f; logits rtn %.5f gptq %.5f awq %.5f\n",
              e_rtn[2], e_gptq[2], e_awq[2], e_rtn[3], e_gptq[3], e_awq[3], e_rtn[0], e_gptq[0],
              e_awq[0]);
  EXPECT_NEAR(e_awq[2], awq.result.layers[0].output_error, 1e-6);
  EXPECT_NEAR(e_rtn[2], rtn.result.layers[0].output_error, 1e-6);
  EXPECT_LT(e_awq[2], e_rtn[2]);
  EXPECT_LT(e_awq[3], e_rtn[3]);
}

// Garbage in the padded positions (other ids, same T) changes nothing; more padded positions
// (a longer T) change only float rounding.
TEST(Layerwise, PaddedPositionsDoNotReachTheObservers) {
  for (W4Method m : {W4Method::Gptq, W4Method::Awq}) {
    SCOPED_TRACE(std::string(w4_method_name(m)));
    const Quantized clean = run(w4(m), default_batches(0));
    const Quantized garbage = run(w4(m), default_batches(-1));
    const Quantized longer = run(w4(m), default_batches(-1, 17));
    for (const std::string& name : all_linears()) {
      SCOPED_TRACE(name);
      EXPECT_TRUE(clean.weights.find_initializer(name)->equals(
          *garbage.weights.find_initializer(name)));
      EXPECT_TRUE(clean.weights.find_initializer(name + "_scale")
                      ->equals(*garbage.weights.find_initializer(name + "_scale")));
      const std::vector<float> a = dequantized(clean.weights, name);
      const std::vector<float> b = dequantized(longer.weights, name);
      double num = 0.0, den = 0.0;
      for (size_t i = 0; i < a.size(); ++i) {
        num += (a[i] - b[i]) * (a[i] - b[i]);
        den += a[i] * a[i];
      }
      EXPECT_LT(std::sqrt(num / den), 0.02);
    }
    for (size_t i = 0; i < clean.result.layers.size(); ++i) {
      EXPECT_EQ(clean.result.layers[i].output_error, garbage.result.layers[i].output_error);
      EXPECT_NEAR(clean.result.layers[i].output_error, longer.result.layers[i].output_error,
                  0.05 * clean.result.layers[i].output_error);
    }
    EXPECT_EQ(clean.result.tokens, longer.result.tokens);
  }
}

// GPTQ's H of layer 2 is built from layer 1's quantized outputs: quantizing layer 2's weights
// with H from running the fake-quant model whole gives the stored codes, while H from the float
// model does not.
TEST(Layerwise, EachLayerSeesThePreviousQuantizedLayer) {
  const Quantized gptq = run(w4(W4Method::Gptq), default_batches());
  // Layers 0 and 1 quantized, layer 2 float: the quantizer observes each layer in float.
  Graph fq = tiny_weights(kLayers);
  for (const std::string& name : all_linears())
    if (name.rfind(lname(2, ""), 0) != 0)
      fq.set_initializer(name, Tensor::from_f32(dequantized(gptq.weights, name),
                                                fq.find_initializer(name)->shape()));
  const Graph fw = tiny_weights(kLayers);
  auto codes_with_h_of = [&](const Graph& model_weights) {
    const TinyDecoder parts(model_weights, kLayers);
    const std::map<std::string, int64_t> channels = {
        {"layers.2.n1", kHidden}, {"layers.2.a", kHidden}, {"layers.2.n2", kHidden},
        {"layers.2.m", kInter}};
    GptqObserver obs(channels);
    Executor ex(parts.whole());
    std::optional<TokenMask> mask;
    ex.set_observer([&](const std::string& name, const Tensor& v) {
      if (!channels.count(name)) return;
      obs.observe(name, mask && mask->covers(v) ? mask->real_rows(v) : v);
    });
    for (const BatchSource::Feeds& b : default_batches()) {
      mask.reset();
      TokenMask m(b, "attention_mask");
      if (!m.all_real()) mask = m;
      ex.run(b);
    }
    // down_proj (reads "m") and q_proj (reads "n1") of layer 2, from the float weights.
    std::map<std::string, std::vector<int8_t>> out;
    for (const auto& [weight, input] :
         std::vector<std::pair<std::string, std::string>>{{lname(2, "mlp.down_proj.weight"), "layers.2.m"},
                                                          {lname(2, "self_attn.q_proj.weight"), "layers.2.n1"}}) {
      const Tensor& w = *fw.find_initializer(weight);
      const int64_t n = w.shape()[0], k = w.shape()[1];
      const std::vector<float> wkn = transposed(std::span<const float>(w.to_f32()), n, k);
      std::vector<int8_t> q(static_cast<size_t>(k * n));
      std::vector<uint16_t> s(static_cast<size_t>(k / 32 * n));
      GptqOptions go;
      go.block_size = 32;
      gptq_quantize(wkn, k, n, obs.activations().at(input).h, go, q, s);
      out[weight] = transposed(std::span<const int8_t>(q), k, n);
    }
    return out;
  };
  const auto from_quantized = codes_with_h_of(fq);
  const auto from_float = codes_with_h_of(fw);
  for (const auto& [weight, codes] : from_quantized) {
    SCOPED_TRACE(weight);
    const Tensor& stored = *gptq.weights.find_initializer(weight);
    std::vector<int8_t> got(codes.size());
    unpack_int4(stored.data<uint8_t>(), got);
    EXPECT_EQ(got, codes);
    EXPECT_NE(got, from_float.at(weight));
  }
}

TEST(Layerwise, Int8PerChannelValues) {
  LayerwiseOptions o;
  o.scheme = LayerwiseScheme::Int8PerChannel;
  const Quantized r = run(o, default_batches());
  EXPECT_EQ(r.result.scheme, "int8-weights");
  const Graph original = tiny_weights(kLayers);
  for (const std::string& name : all_linears()) {
    SCOPED_TRACE(name);
    const Tensor& w = *original.find_initializer(name);
    const int64_t n = w.shape()[0], k = w.shape()[1];
    const std::vector<float> v = w.to_f32();
    const Tensor& q = *r.weights.find_initializer(name);
    const Tensor& s = *r.weights.find_initializer(name + "_scale");
    ASSERT_EQ(q.dtype(), DType::I8);
    ASSERT_EQ(q.shape(), (Shape{n, k}));
    ASSERT_EQ(s.dtype(), DType::F32);
    ASSERT_EQ(s.shape(), (Shape{n}));
    const auto qv = q.data<int8_t>();
    const auto sv = s.data<float>();
    for (int64_t c = 0; c < n; ++c) {
      float am = 0.0f;
      for (int64_t j = 0; j < k; ++j) am = std::max(am, std::fabs(v[static_cast<size_t>(c * k + j)]));
      ASSERT_EQ(sv[static_cast<size_t>(c)], am / 127.0f);
      for (int64_t j = 0; j < k; ++j) {
        const float x = v[static_cast<size_t>(c * k + j)] / sv[static_cast<size_t>(c)];
        ASSERT_EQ(qv[static_cast<size_t>(c * k + j)], static_cast<int8_t>(std::nearbyint(x)));
      }
    }
    const QuantRecord* rec = r.weights.find_quant_record(name);
    ASSERT_NE(rec, nullptr);
    EXPECT_EQ(rec->bits, 8);
    EXPECT_EQ(rec->block_size, 0);
  }
  for (const LayerResult& l : r.result.layers) EXPECT_LT(l.output_error, 0.05);
}

TEST(Layerwise, ResultsDoNotDependOnTheThreadCount) {
  for (W4Method m : {W4Method::Rtn, W4Method::Gptq, W4Method::Awq}) {
    SCOPED_TRACE(std::string(w4_method_name(m)));
    LayerwiseOptions one = w4(m), four = w4(m);
    one.threads = 1;
    four.threads = 4;
    const Quantized a = run(one, default_batches());
    const Quantized b = run(four, default_batches());
    ASSERT_EQ(a.weights.initializers().size(), b.weights.initializers().size());
    for (const auto& [name, t] : a.weights.initializers()) {
      SCOPED_TRACE(name);
      EXPECT_TRUE(t.equals(*b.weights.find_initializer(name)));
    }
    for (size_t i = 0; i < a.result.layers.size(); ++i) {
      EXPECT_EQ(a.result.layers[i].output_error, b.result.layers[i].output_error);
      for (size_t j = 0; j < a.result.layers[i].linears.size(); ++j)
        EXPECT_EQ(a.result.layers[i].linears[j].output_error,
                  b.result.layers[i].linears[j].output_error);
    }
  }
}

class Recorder final : public LayerProgress {
 public:
  void prologue_done(int64_t samples, int64_t tokens, double) override {
    this->samples = samples;
    this->tokens = tokens;
  }
  void layer_done(const LayerResult& layer, int64_t num_layers) override {
    lines.push_back(layerwise_progress_line(layer, num_layers));
  }
  int64_t samples = 0, tokens = 0;
  std::vector<std::string> lines;
};

TEST(Layerwise, ReportsProgressAndJson) {
  Graph weights = tiny_weights(kLayers);
  const Graph fw = tiny_weights(kLayers);
  TinyDecoder parts(fw, kLayers);
  MemoryBatches data(default_batches(), "tiny ids");
  Recorder rec;
  LayerwiseOptions o = w4(W4Method::Awq, 64);
  o.error_samples = 4;
  const LayerwiseResult r = quantize_layerwise(parts, weights, data, o, &rec);
  EXPECT_EQ(rec.samples, 16);
  int64_t tokens = 0;
  for (int64_t l : kLengths) tokens += l;
  EXPECT_EQ(rec.tokens, tokens);
  ASSERT_EQ(rec.lines.size(), 3u);
  EXPECT_EQ(rec.lines[0].rfind("layer 1/3", 0), 0u) << rec.lines[0];
  EXPECT_EQ(r.layers[0].error_tokens, 12 + 7 + 9 + 12);  // the first batch of 4 samples
  const nlohmann::ordered_json j = layerwise_result_json(r);
  EXPECT_EQ(j["method"], "awq");
  EXPECT_EQ(j["block_size"], 64);
  ASSERT_EQ(j["layers"].size(), 3u);
  EXPECT_EQ(j["layers"][1]["linears"].size(), 6u);
  EXPECT_TRUE(j["layers"][1]["linears"][0].contains("alpha"));
}

TEST(Layerwise, RefusesABlockSizeThatDoesNotDivide) {
  EXPECT_THROW(run(w4(W4Method::Rtn, 256), default_batches()), Error);
  EXPECT_THROW(run(w4(W4Method::Rtn, 48), default_batches()), Error);
}

}  // namespace
}  // namespace qforge
