#pragma once
// A hand-made DecoderParts for the layer-wise tests: a tiny decoder whose layers are
//   n1 = x * norm1;  u = n1 Wq^T;  v = n1 Wv^T;  ctx = softmax(bias) v  (a mean over the real
//   tokens: the prologue's additive mask is 0 there and -1e9 on padding);  a = u + ctx;
//   h1 = x + a Wo^T;  n2 = h1 * norm2;  m = silu(n2 Wg^T) * (n2 Wu^T);  y = h1 + m Wd^T
// with every Linear a Transpose + MatMul of an [out, in] initializer named as a Hugging Face
// folder names it. The prologue gathers the embedding (a few outlier channels, so that AWQ has
// salient inputs to protect) and builds the mask; the epilogue is lm_head.
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "ir/batch_source.h"
#include "ir/decoder_parts.h"
#include "ir/graph.h"

namespace qforge::test::layerwise {

inline constexpr int64_t kVocab = 32;
inline constexpr int64_t kHidden = 64;
inline constexpr int64_t kInter = 128;

inline std::string lname(int64_t i, const std::string& what) {
  return "model.layers." + std::to_string(i) + "." + what;
}

inline Tensor normal(const Shape& shape, uint32_t seed, float sd) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, sd);
  std::vector<float> v(shape_numel(shape));
  for (float& x : v) x = dist(rng);
  return Tensor::from_f32(v, shape);
}

// The model folder's tensors.
inline Graph tiny_weights(int64_t layers, uint32_t seed = 7) {
  Graph w;
  Tensor emb = normal({kVocab, kHidden}, seed, 1.0f);
  std::vector<float> e = emb.to_f32();
  for (int64_t r = 0; r < kVocab; ++r)
    for (int64_t c : {3, 17, 40}) e[static_cast<size_t>(r * kHidden + c)] *= 8.0f;
  w.set_initializer("model.embed_tokens.weight", Tensor::from_f32(e, {kVocab, kHidden}));
  for (int64_t i = 0; i < layers; ++i) {
    const auto s = static_cast<uint32_t>(seed + 100 * (i + 1));
    std::vector<float> norm(kHidden);
    std::mt19937 rng(s);
    std::uniform_real_distribution<float> u(0.5f, 1.5f);
    for (float& x : norm) x = u(rng);
    w.set_initializer(lname(i, "input_layernorm.weight"), Tensor::from_f32(norm, {kHidden}));
    for (float& x : norm) x = u(rng);
    w.set_initializer(lname(i, "post_attention_layernorm.weight"),
                      Tensor::from_f32(norm, {kHidden}));
    w.set_initializer(lname(i, "self_attn.q_proj.weight"), normal({kHidden, kHidden}, s + 1, 0.1f));
    w.set_initializer(lname(i, "self_attn.v_proj.weight"), normal({kHidden, kHidden}, s + 2, 0.1f));
    w.set_initializer(lname(i, "self_attn.o_proj.weight"), normal({kHidden, kHidden}, s + 3, 0.1f));
    w.set_initializer(lname(i, "mlp.gate_proj.weight"), normal({kInter, kHidden}, s + 4, 0.1f));
    w.set_initializer(lname(i, "mlp.up_proj.weight"), normal({kInter, kHidden}, s + 5, 0.1f));
    w.set_initializer(lname(i, "mlp.down_proj.weight"), normal({kHidden, kInter}, s + 6, 0.1f));
  }
  w.set_initializer("lm_head.weight", normal({kVocab, kHidden}, seed + 3, 0.1f));
  return w;
}

inline Node node(std::string op, std::vector<std::string> in, std::vector<std::string> out,
                 std::vector<Attribute> attrs = {}) {
  Node n;
  n.name = out.front() + "_" + op;
  n.op_type = std::move(op);
  n.inputs = std::move(in);
  n.outputs = std::move(out);
  n.attributes = std::move(attrs);
  return n;
}

class TinyDecoder final : public DecoderParts {
 public:
  TinyDecoder(const Graph& weights, int64_t layers) : w_(weights), layers_(layers) {}

  [[nodiscard]] int64_t num_layers() const override { return layers_; }
  [[nodiscard]] std::vector<std::string> side_values() const override { return {"attn_bias"}; }

  [[nodiscard]] Graph prologue() const override {
    Graph g = base();
    add_inputs(g);
    add_prologue(g);
    g.outputs.push_back({.name = "hidden_states", .dtype = DType::F32});
    g.outputs.push_back({.name = "attn_bias", .dtype = DType::F32});
    return g;
  }

  [[nodiscard]] Graph layer(int64_t i) const override {
    Graph g = base();
    g.inputs.push_back({.name = "hidden_states", .dtype = DType::F32});
    g.inputs.push_back({.name = "attn_bias", .dtype = DType::F32});
    add_layer(g, i, "", "hidden_states", "layer_output");
    g.outputs.push_back({.name = "layer_output", .dtype = DType::F32});
    return g;
  }

  [[nodiscard]] std::vector<DecoderLinear> linears(int64_t i) const override {
    auto lin = [&](const std::string& what, const std::string& input, const std::string& group,
                   const std::string& norm, int64_t out, int64_t in) {
      return DecoderLinear{lname(i, what), "", input, group,
                           norm.empty() ? "" : lname(i, norm), out, in};
    };
    return {lin("self_attn.q_proj.weight", "n1", "attn_in", "input_layernorm.weight", kHidden,
                kHidden),
            lin("self_attn.v_proj.weight", "n1", "attn_in", "input_layernorm.weight", kHidden,
                kHidden),
            lin("self_attn.o_proj.weight", "a", "attn_out", "", kHidden, kHidden),
            lin("mlp.gate_proj.weight", "n2", "mlp_in", "post_attention_layernorm.weight", kInter,
                kHidden),
            lin("mlp.up_proj.weight", "n2", "mlp_in", "post_attention_layernorm.weight", kInter,
                kHidden),
            lin("mlp.down_proj.weight", "m", "mlp_out", "", kHidden, kInter)};
  }

  [[nodiscard]] Graph epilogue() const override {
    Graph g = base();
    g.inputs.push_back({.name = "hidden_states", .dtype = DType::F32});
    add_epilogue(g, "hidden_states");
    g.outputs.push_back({.name = "logits", .dtype = DType::F32});
    return g;
  }

  // The whole model; `layer_inputs` also makes each layer's input hidden states an output
  // ("layers.<i>.input") and its Linear inputs observable as "layers.<i>.<value>".
  [[nodiscard]] Graph whole() const override { return whole_with(false); }
  [[nodiscard]] Graph whole_with(bool layer_inputs) const {
    Graph g = base();
    add_inputs(g);
    add_prologue(g);
    std::string h = "hidden_states";
    for (int64_t i = 0; i < layers_; ++i) {
      const std::string p = "layers." + std::to_string(i) + ".";
      g.nodes.push_back(node("Identity", {h}, {p + "input"}));
      if (layer_inputs) g.outputs.push_back({.name = p + "input", .dtype = DType::F32});
      add_layer(g, i, p, p + "input", p + "output");
      h = p + "output";
    }
    add_epilogue(g, h);
    g.outputs.insert(g.outputs.begin(), {.name = "logits", .dtype = DType::F32});
    return g;
  }

 private:
  static Graph base() {
    Graph g;
    g.set_opset("", 17);
    return g;
  }

  void init(Graph& g, const std::string& name) const {
    g.set_initializer(name, *w_.find_initializer(name));
  }

  static void add_inputs(Graph& g) {
    const Dim b{.param = "batch"}, t{.param = "seq"};
    g.inputs.push_back({.name = "input_ids", .dtype = DType::I64, .shape = std::vector<Dim>{b, t}});
    g.inputs.push_back(
        {.name = "attention_mask", .dtype = DType::I64, .shape = std::vector<Dim>{b, t}});
  }

  void add_prologue(Graph& g) const {
    init(g, "model.embed_tokens.weight");
    g.set_initializer("one", Tensor::from_f32(std::vector<float>{1.0f}, {}));
    g.set_initializer("big", Tensor::from_f32(std::vector<float>{1e9f}, {}));
    Tensor axes(DType::I64, {1});
    axes.mutable_data<int64_t>()[0] = 1;
    g.set_initializer("axis1", axes);
    g.nodes.push_back(node("Gather", {"model.embed_tokens.weight", "input_ids"}, {"hidden_states"}));
    Node cast = node("Cast", {"attention_mask"}, {"mask_f"});
    cast.set_attr(Attribute::make_int("to", 1));
    g.nodes.push_back(cast);
    g.nodes.push_back(node("Sub", {"mask_f", "one"}, {"mask_m1"}));
    g.nodes.push_back(node("Mul", {"mask_m1", "big"}, {"bias2"}));
    g.nodes.push_back(node("Unsqueeze", {"bias2", "axis1"}, {"attn_bias"}));
  }

  void linear(Graph& g, const std::string& p, int64_t i, const std::string& what,
              const std::string& x, const std::string& y) const {
    init(g, lname(i, what));
    g.nodes.push_back(node("Transpose", {lname(i, what)}, {p + y + "_wt"}));
    g.nodes.push_back(node("MatMul", {x, p + y + "_wt"}, {p + y}));
  }

  void add_layer(Graph& g, int64_t i, const std::string& p, const std::string& x,
                 const std::string& out) const {
    init(g, lname(i, "input_layernorm.weight"));
    init(g, lname(i, "post_attention_layernorm.weight"));
    g.nodes.push_back(node("Mul", {x, lname(i, "input_layernorm.weight")}, {p + "n1"}));
    linear(g, p, i, "self_attn.q_proj.weight", p + "n1", "u");
    linear(g, p, i, "self_attn.v_proj.weight", p + "n1", "v");
    Node sm = node("Softmax", {"attn_bias"}, {p + "probs"});
    sm.set_attr(Attribute::make_int("axis", -1));
    g.nodes.push_back(sm);
    g.nodes.push_back(node("MatMul", {p + "probs", p + "v"}, {p + "ctx"}));
    g.nodes.push_back(node("Add", {p + "u", p + "ctx"}, {p + "a"}));
    linear(g, p, i, "self_attn.o_proj.weight", p + "a", "o");
    g.nodes.push_back(node("Add", {x, p + "o"}, {p + "h1"}));
    g.nodes.push_back(node("Mul", {p + "h1", lname(i, "post_attention_layernorm.weight")},
                           {p + "n2"}));
    linear(g, p, i, "mlp.gate_proj.weight", p + "n2", "gate");
    linear(g, p, i, "mlp.up_proj.weight", p + "n2", "up");
    g.nodes.push_back(node("Sigmoid", {p + "gate"}, {p + "sig"}));
    g.nodes.push_back(node("Mul", {p + "gate", p + "sig"}, {p + "silu"}));
    g.nodes.push_back(node("Mul", {p + "silu", p + "up"}, {p + "m"}));
    linear(g, p, i, "mlp.down_proj.weight", p + "m", "down");
    g.nodes.push_back(node("Add", {p + "h1", p + "down"}, {out}));
  }

  void add_epilogue(Graph& g, const std::string& h) const {
    init(g, "lm_head.weight");
    g.nodes.push_back(node("Transpose", {"lm_head.weight"}, {"lm_head_wt"}));
    g.nodes.push_back(node("MatMul", {h, "lm_head_wt"}, {"logits"}));
  }

  const Graph& w_;
  int64_t layers_;
};

// Batches of token ids: rows of `lengths[r]` real tokens (random ids 1..vocab-1), padded to `t`
// with `pad_id` (or random garbage when pad_id < 0) and mask 0.
inline std::vector<BatchSource::Feeds> token_batches(const std::vector<int64_t>& lengths,
                                                     int64_t t, int64_t batch, int64_t pad_id,
                                                     uint32_t seed = 11) {
  std::mt19937 rng(seed), garbage(seed + 999);
  std::uniform_int_distribution<int64_t> id(1, kVocab - 1);
  std::vector<BatchSource::Feeds> out;
  const auto n = static_cast<int64_t>(lengths.size());
  for (int64_t first = 0; first < n; first += batch) {
    const int64_t b = std::min(batch, n - first);
    Tensor ids(DType::I64, {b, t}), mask(DType::I64, {b, t});
    auto iv = ids.mutable_data<int64_t>();
    auto mv = mask.mutable_data<int64_t>();
    for (int64_t r = 0; r < b; ++r)
      for (int64_t p = 0; p < t; ++p) {
        const auto at = static_cast<size_t>(r * t + p);
        const bool real = p < lengths[static_cast<size_t>(first + r)];
        if (real) {
          iv[at] = id(rng);
        } else {
          iv[at] = pad_id >= 0 ? pad_id : id(garbage);
        }
        mv[at] = real ? 1 : 0;
      }
    out.push_back({{"input_ids", std::move(ids)}, {"attention_mask", std::move(mask)}});
  }
  return out;
}

}  // namespace qforge::test::layerwise
