// The decoder graph of a model folder: see importers/hf/decoder_builder.h. One Emitter writes
// nodes into a Graph; the prologue, each layer and the epilogue are written by one function
// each, which whole() calls in turn on one graph and the parts call on their own.
#include "importers/hf/decoder_builder.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <unordered_map>
#include <unordered_set>

#include "importers/load_model.h"
#include "ir/error.h"
#include "ir/quantized_linear.h"

namespace qforge {

namespace {

const std::string kEmbed = "model.embed_tokens.weight";
const std::string kFinalNorm = "model.norm.weight";
const std::string kLmHead = "lm_head.weight";

std::string layer_prefix(int64_t i) { return "model.layers." + std::to_string(i) + "."; }

// Symbolic dimension names of the graph inputs and outputs.
Dim sym(const char* name) { return Dim{std::nullopt, name}; }
Dim fixed(int64_t v) { return Dim{v, ""}; }

ValueInfo value_info(std::string_view name, DType dtype, std::vector<Dim> shape) {
  ValueInfo v;
  v.name = std::string(name);
  v.dtype = dtype;
  v.shape = std::move(shape);
  return v;
}

// A float tensor of the folder as f32: the same (mapped) tensor when it already is one.
Tensor as_f32(const Tensor& t) {
  if (t.dtype() == DType::F32) return t;
  const std::vector<float> v = t.to_f32();
  return Tensor::from_f32(v, t.shape());
}

std::string int_list_name(const std::vector<int64_t>& v) {
  std::string s;
  for (int64_t x : v) {
    s += '_';
    if (x < 0) s += 'm';
    s += std::to_string(x < 0 ? -x : x);
  }
  return s;
}

// Writes nodes and initializers into one graph. Node names are unique; a node's (first) output
// takes the node's name unless another is given. Constants are initializers named by content
// and shared by every node that needs the same one.
class Emitter {
 public:
  Emitter(Graph& g, const std::unordered_map<std::string, Tensor>& weights)
      : g_(g), weights_(weights) {}

  std::string op(const std::string& op_type, std::vector<std::string> inputs,
                 const std::string& name, std::vector<Attribute> attrs = {},
                 std::string out = "") {
    if (!node_names_.insert(name).second) {
      fail_internal("decoder builder: node '" + name + "' twice");
    }
    Node n;
    n.name = name;
    n.op_type = op_type;
    n.inputs = std::move(inputs);
    n.outputs = {out.empty() ? name : std::move(out)};
    n.attributes = std::move(attrs);
    g_.nodes.push_back(std::move(n));
    return g_.nodes.back().outputs[0];
  }

  // The folder's tensor `name` as an f32 initializer of the graph (once).
  std::string weight(const std::string& name) {
    if (!g_.has_initializer(name)) {
      const auto it = weights_.find(name);
      if (it == weights_.end()) fail_internal("decoder builder: tensor '" + name + "' unchecked");
      g_.set_initializer(name, as_f32(it->second));
    }
    return name;
  }

  std::string i64(const std::vector<int64_t>& v, bool scalar = false) {
    const std::string name =
        std::string(scalar ? "const_i64_scalar" : "const_i64") + int_list_name(v);
    if (!g_.has_initializer(name)) {
      Tensor t(DType::I64, scalar ? Shape{} : Shape{static_cast<int64_t>(v.size())});
      std::copy(v.begin(), v.end(), t.mutable_data<int64_t>().begin());
      g_.set_initializer(name, std::move(t));
    }
    return name;
  }

  std::string f32_scalar(float v, const std::string& what) {
    const std::string name = "const_f32_" + what;
    if (!g_.has_initializer(name)) g_.set_initializer(name, Tensor::from_f32({&v, 1}, Shape{}));
    return name;
  }

  std::string f32(const std::vector<float>& v, const std::string& what) {
    const std::string name = "const_f32_" + what;
    if (!g_.has_initializer(name)) {
      g_.set_initializer(name, Tensor::from_f32(v, Shape{static_cast<int64_t>(v.size())}));
    }
    return name;
  }

  // Cached per (value, key): Reshape of an input shared by the Linears reading it, shapes
  // built from [B, T].
  std::map<std::pair<std::string, std::string>, std::string> cache;

 private:
  Graph& g_;
  const std::unordered_map<std::string, Tensor>& weights_;
  std::unordered_set<std::string> node_names_;
};

Attribute ints(const char* name, std::vector<int64_t> v) {
  return Attribute::make_ints(name, std::move(v));
}
Attribute int_attr(const char* name, int64_t v) { return Attribute::make_int(name, v); }

// The values a part computes once and its layers share: [B, T] as an i64 [2] tensor.
struct Frame {
  std::string bt;  // Shape(...)[0:2]
};

// Reshape of a 2-D [B*T, k...] result back to [B, T, dims...].
std::string to_bt(Emitter& e, const Frame& f, const std::string& x,
                  const std::vector<int64_t>& dims, const std::string& name) {
  const auto key = std::make_pair(f.bt, int_list_name(dims));
  auto it = e.cache.find(key);
  if (it == e.cache.end()) {
    const std::string shape =
        e.op("Concat", {f.bt, e.i64(dims)}, f.bt + "_shape" + int_list_name(dims),
             {int_attr("axis", 0)});
    it = e.cache.emplace(key, shape).first;
  }
  return e.op("Reshape", {x, it->second}, name);
}

// RMSNorm over the last axis, as transformers' LlamaRMSNorm in f32: the result value is `out`.
std::string rms_norm(Emitter& e, const std::string& x, const std::string& weight,
                     const std::string& name, float eps, const std::string& out) {
  const std::string sq = e.op("Mul", {x, x}, name + "/square");
  const std::string var =
      e.op("ReduceMean", {sq}, name + "/mean", {ints("axes", {-1}), int_attr("keepdims", 1)});
  const std::string ve = e.op("Add", {var, e.f32_scalar(eps, "rms_norm_eps")}, name + "/add_eps");
  const std::string sd = e.op("Sqrt", {ve}, name + "/sqrt");
  const std::string inv = e.op("Reciprocal", {sd}, name + "/rsqrt");
  const std::string normed = e.op("Mul", {x, inv}, name + "/normalize");
  return e.op("Mul", {normed, e.weight(weight)}, name + "/scale", {}, out);
}

// y2d = x2d W^T (+ b): the Gemm the W4A16 passes find (B stored [N, K], transB).
std::string gemm(Emitter& e, const std::string& x2d, const std::string& module, bool bias) {
  std::vector<std::string> in = {x2d, e.weight(module + ".weight")};
  if (bias) in.push_back(e.weight(module + ".bias"));
  return e.op("Gemm", std::move(in), module, {int_attr("transB", 1)}, module + "/output");
}

// x [B, T, k] as [B*T, k], one Reshape per value.
std::string rows_of(Emitter& e, const std::string& x, int64_t k, const std::string& name) {
  const auto key = std::make_pair(x, std::string("rows"));
  const auto it = e.cache.find(key);
  if (it != e.cache.end()) return it->second;
  const std::string r = e.op("Reshape", {x, e.i64({-1, k})}, name);
  e.cache.emplace(key, r);
  return r;
}

std::string slice_last(Emitter& e, const std::string& x, int64_t begin, int64_t end,
                       const std::string& name) {
  return e.op("Slice", {x, e.i64({begin}), e.i64({end}), e.i64({-1})}, name);
}

// transformers' apply_rotary_pos_emb on x [B, heads, T, D]: the first R channels become
// x * cos + rotate_half(x) * sin, the rest pass (Phi-3's partial rotary factor).
std::string rope(Emitter& e, const std::string& x, int64_t d, int64_t r, const std::string& name) {
  const std::string cos(kDecoderRopeCos), sin(kDecoderRopeSin);
  const std::string rot = r == d ? x : slice_last(e, x, 0, r, name + "/rot");
  const std::string x1 = slice_last(e, rot, 0, r / 2, name + "/x1");
  const std::string x2 = slice_last(e, rot, r / 2, r, name + "/x2");
  const std::string neg = e.op("Neg", {x2}, name + "/neg_x2");
  const std::string half = e.op("Concat", {neg, x1}, name + "/rotate_half", {int_attr("axis", -1)});
  const std::string a = e.op("Mul", {rot, cos}, name + "/mul_cos");
  const std::string b = e.op("Mul", {half, sin}, name + "/mul_sin");
  const std::string emb = e.op("Add", {a, b}, name + "/embed");
  if (r == d) return emb;
  const std::string pass = slice_last(e, x, r, d, name + "/pass");
  return e.op("Concat", {emb, pass}, name + "/concat", {int_attr("axis", -1)});
}

class HfDecoderParts final : public DecoderParts {
 public:
  HfDecoderParts(DecoderConfig config, std::unordered_map<std::string, Tensor> weights, bool tied)
      : c_(std::move(config)), weights_(std::move(weights)), tied_(tied) {}

  [[nodiscard]] int64_t num_layers() const override { return c_.num_layers; }

  [[nodiscard]] std::vector<std::string> side_values() const override {
    std::vector<std::string> s = {std::string(kDecoderAttentionBias)};
    if (split_bias()) s.emplace_back(kDecoderSlidingAttentionBias);
    s.emplace_back(kDecoderRopeCos);
    s.emplace_back(kDecoderRopeSin);
    return s;
  }

  [[nodiscard]] Graph prologue() const override {
    Graph g = new_graph("prologue");
    Emitter e(g, weights_);
    add_token_inputs(g);
    emit_prologue(e, std::string(kDecoderHidden));
    g.outputs.push_back(hidden_info(kDecoderHidden));
    for (const ValueInfo& v : side_infos()) g.outputs.push_back(v);
    return g;
  }

  [[nodiscard]] Graph layer(int64_t i) const override {
    check_layer(i);
    Graph g = new_graph("layer_" + std::to_string(i));
    Emitter e(g, weights_);
    g.inputs.push_back(hidden_info(kDecoderHidden));
    for (const ValueInfo& v : side_infos()) g.inputs.push_back(v);
    const Frame f{e.op("Shape", {std::string(kDecoderHidden)}, "batch_sequence",
                       {int_attr("start", 0), int_attr("end", 2)})};
    emit_layer(e, f, i, std::string(kDecoderHidden), std::string(kDecoderLayerOutput));
    g.outputs.push_back(hidden_info(kDecoderLayerOutput));
    return g;
  }

  [[nodiscard]] std::vector<DecoderLinear> linears(int64_t i) const override {
    check_layer(i);
    const std::string p = layer_prefix(i);
    const int64_t h = c_.hidden_size, d = c_.head_dim;
    const int64_t q_out = c_.num_heads * d, kv_out = c_.num_kv_heads * d;
    const int64_t inter = c_.intermediate_size;
    const std::string attn_in = p + "input_layernorm";
    const std::string attn_norm = p + "input_layernorm.weight";
    const std::string mlp_in = p + "post_attention_layernorm";
    const std::string mlp_norm = p + "post_attention_layernorm.weight";
    auto linear = [&](const std::string& module, bool bias, const std::string& input,
                      const std::string& group, const std::string& norm, int64_t out,
                      int64_t in) {
      return DecoderLinear{module + ".weight", bias ? module + ".bias" : "", input, group, norm,
                           out, in};
    };
    std::vector<DecoderLinear> l;
    if (c_.fused_qkv) {
      l.push_back(linear(p + "self_attn.qkv_proj", c_.qkv_bias, attn_in, "attn_in", attn_norm,
                         q_out + 2 * kv_out, h));
      l.back().attention_scores = true;
    } else {
      l.push_back(linear(p + "self_attn.q_proj", c_.qkv_bias, attn_in, "attn_in", attn_norm,
                         q_out, h));
      l.back().attention_scores = true;
      l.push_back(linear(p + "self_attn.k_proj", c_.qkv_bias, attn_in, "attn_in", attn_norm,
                         kv_out, h));
      l.back().attention_scores = true;
      l.push_back(linear(p + "self_attn.v_proj", c_.qkv_bias, attn_in, "attn_in", attn_norm,
                         kv_out, h));
    }
    l.push_back(linear(p + "self_attn.o_proj", c_.o_bias, p + "self_attn.o_proj/input",
                       "attn_out", "", h, q_out));
    if (!c_.fused_qkv && c_.num_kv_heads == c_.num_heads) {
      l.back().producer = p + "self_attn.v_proj.weight";
    }
    if (c_.fused_gate_up) {
      l.push_back(linear(p + "mlp.gate_up_proj", c_.mlp_bias, mlp_in, "mlp_in", mlp_norm,
                         2 * inter, h));
    } else {
      l.push_back(linear(p + "mlp.gate_proj", c_.mlp_bias, mlp_in, "mlp_in", mlp_norm, inter, h));
      l.push_back(linear(p + "mlp.up_proj", c_.mlp_bias, mlp_in, "mlp_in", mlp_norm, inter, h));
    }
    l.push_back(linear(p + "mlp.down_proj", c_.mlp_bias, p + "mlp.down_proj/input", "mlp_out", "",
                       h, inter));
    if (!c_.fused_gate_up) l.back().producer = p + "mlp.up_proj.weight";
    return l;
  }

  [[nodiscard]] Graph epilogue() const override {
    Graph g = new_graph("epilogue");
    Emitter e(g, weights_);
    g.inputs.push_back(hidden_info(kDecoderHidden));
    const Frame f{e.op("Shape", {std::string(kDecoderHidden)}, "batch_sequence",
                       {int_attr("start", 0), int_attr("end", 2)})};
    emit_epilogue(e, f, std::string(kDecoderHidden));
    g.outputs.push_back(logits_info());
    return g;
  }

  [[nodiscard]] Graph whole() const override {
    Graph g = new_graph(c_.model_type);
    Emitter e(g, weights_);
    add_token_inputs(g);
    const Frame f = emit_prologue(e, std::string(kDecoderHidden));
    std::string x(kDecoderHidden);
    for (int64_t i = 0; i < c_.num_layers; ++i) {
      const std::string out = layer_prefix(i) + "output";
      emit_layer(e, f, i, x, out);
      x = out;
    }
    emit_epilogue(e, f, x);
    g.outputs.push_back(logits_info());
    return g;
  }

 private:
  // A separate bias for sliding layers only when some layers slide and others do not.
  [[nodiscard]] bool split_bias() const { return c_.any_sliding() && !c_.all_sliding(); }

  void check_layer(int64_t i) const {
    if (i < 0 || i >= c_.num_layers) {
      fail_usage("decoder layer " + std::to_string(i) + " does not exist (the model has " +
                 std::to_string(c_.num_layers) + ")");
    }
  }

  [[nodiscard]] Graph new_graph(const std::string& name) const {
    Graph g;
    g.name = name;
    g.set_opset("", kDecoderOpset);
    g.model.producer_name = "qforge";
    g.set_metadata("model_type", c_.model_type);
    return g;
  }

  [[nodiscard]] ValueInfo hidden_info(std::string_view name) const {
    return value_info(name, DType::F32, {sym("batch"), sym("sequence"), fixed(c_.hidden_size)});
  }
  [[nodiscard]] ValueInfo logits_info() const {
    return value_info(kDecoderLogits, DType::F32,
                      {sym("batch"), sym("sequence"), fixed(c_.vocab_size)});
  }
  [[nodiscard]] std::vector<ValueInfo> side_infos() const {
    std::vector<ValueInfo> v;
    for (const std::string& name : side_values()) {
      const bool bias = name == kDecoderAttentionBias || name == kDecoderSlidingAttentionBias;
      v.push_back(value_info(name, DType::F32,
                             {sym("batch"), fixed(1), sym("sequence"),
                              bias ? sym("sequence") : fixed(c_.rotary_dim)}));
    }
    return v;
  }
  static void add_token_inputs(Graph& g) {
    g.inputs.push_back(value_info(kDecoderInputIds, DType::I64, {sym("batch"), sym("sequence")}));
    g.inputs.push_back(
        value_info(kDecoderAttentionMask, DType::I64, {sym("batch"), sym("sequence")}));
  }

  // Embedding, positions, RoPE tables and the attention biases.
  Frame emit_prologue(Emitter& e, const std::string& hidden) const {
    const std::string ids(kDecoderInputIds), mask(kDecoderAttentionMask);
    e.op("Gather", {e.weight(kEmbed), ids}, "model.embed_tokens", {int_attr("axis", 0)}, hidden);
    const Frame f{e.op("Shape", {ids}, "batch_sequence")};
    // Positions: cumsum(mask) - 1, clamped at 0 (pads before the first token).
    const std::string cs = e.op("CumSum", {mask, e.i64({1}, true)}, "positions/cumsum");
    const std::string pm1 = e.op("Sub", {cs, e.i64({1}, true)}, "positions/minus_one");
    const std::string pos = e.op("Max", {pm1, e.i64({0}, true)}, "positions");
    const std::string posf = e.op("Cast", {pos}, "positions/float",
                                  {int_attr("to", dtype_to_onnx(DType::F32))});
    const std::string pos3 = e.op("Unsqueeze", {posf, e.i64({2})}, "rope/positions");
    const std::string freqs =
        e.op("Mul", {pos3, e.f32(c_.rope_inv_freq(), "rope_inv_freq")}, "rope/freqs");
    const std::string emb = e.op("Concat", {freqs, freqs}, "rope/emb", {int_attr("axis", -1)});
    const std::string cos = e.op("Cos", {emb}, "rope/cos");
    const std::string sin = e.op("Sin", {emb}, "rope/sin");
    e.op("Unsqueeze", {cos, e.i64({1})}, "rope/cos_heads", {}, std::string(kDecoderRopeCos));
    e.op("Unsqueeze", {sin, e.i64({1})}, "rope/sin_heads", {}, std::string(kDecoderRopeSin));
    // allowed[b, i, j] = j <= i and (key j real or j == i), as bool [B, 1, T, T].
    const std::string t = e.op("Slice", {f.bt, e.i64({1}), e.i64({2})}, "mask/sequence");
    const std::string ts = e.op("Squeeze", {t, e.i64({0})}, "mask/sequence_scalar");
    const std::string idx =
        e.op("Range", {e.i64({0}, true), ts, e.i64({1}, true)}, "mask/index");
    const std::string rows = e.op("Unsqueeze", {idx, e.i64({1})}, "mask/query_index");
    const std::string cols = e.op("Unsqueeze", {idx, e.i64({0})}, "mask/key_index");
    const std::string causal = e.op("LessOrEqual", {cols, rows}, "mask/causal");
    const std::string diag = e.op("Equal", {cols, rows}, "mask/diagonal");
    const std::string real = e.op("Cast", {mask}, "mask/key_is_token",
                                  {int_attr("to", dtype_to_onnx(DType::Bool))});
    const std::string real4 = e.op("Unsqueeze", {real, e.i64({1, 2})}, "mask/key_is_token_4d");
    const std::string key_ok = e.op("Or", {real4, diag}, "mask/key_allowed");
    const std::string allowed = e.op("And", {key_ok, causal}, "mask/allowed");
    const std::string zero = e.f32_scalar(0.0f, "zero");
    const std::string lowest = e.f32_scalar(std::numeric_limits<float>::lowest(), "lowest");
    std::string window_ok;
    if (c_.any_sliding()) {
      const std::string dist = e.op("Sub", {rows, cols}, "mask/distance");
      window_ok = e.op("Less", {dist, e.i64({*c_.sliding_window}, true)}, "mask/in_window");
    }
    if (c_.all_sliding()) {
      const std::string a = e.op("And", {allowed, window_ok}, "mask/allowed_in_window");
      e.op("Where", {a, zero, lowest}, "mask/bias", {}, std::string(kDecoderAttentionBias));
    } else {
      e.op("Where", {allowed, zero, lowest}, "mask/bias", {}, std::string(kDecoderAttentionBias));
    }
    if (split_bias()) {
      const std::string a = e.op("And", {allowed, window_ok}, "mask/allowed_in_window");
      e.op("Where", {a, zero, lowest}, "mask/sliding_bias", {},
           std::string(kDecoderSlidingAttentionBias));
    }
    return f;
  }

  // [B, T, k] -> [B*T, k] -> Gemm, per Linear; then [B, heads, T, D] per attention input.
  std::string heads_of(Emitter& e, const Frame& f, const std::string& x2d, int64_t heads,
                       const std::string& norm_weight, const std::string& name) const {
    std::string x4 = to_bt(e, f, x2d, {heads, c_.head_dim}, name + "/heads");
    if (!norm_weight.empty()) {
      x4 = rms_norm(e, x4, norm_weight, name + "/norm", static_cast<float>(c_.rms_norm_eps),
                    name + "/normed");
    }
    return e.op("Transpose", {x4}, name + "/transpose", {ints("perm", {0, 2, 1, 3})});
  }

  // GQA: [B, kv, T, D] -> [B, kv * rep, T, D], each kv head repeated rep times in a row.
  std::string repeat_kv(Emitter& e, const std::string& x, const std::string& name) const {
    const int64_t rep = c_.num_heads / c_.num_kv_heads;
    if (rep == 1) return x;
    const std::string u = e.op("Unsqueeze", {x, e.i64({2})}, name + "/unsqueeze");
    const std::string ex = e.op("Expand", {u, e.i64({1, 1, rep, 1, 1})}, name + "/expand");
    return e.op("Reshape", {ex, e.i64({0, c_.num_heads, -1, c_.head_dim})}, name + "/merge");
  }

  void emit_layer(Emitter& e, const Frame& f, int64_t i, const std::string& in,
                  const std::string& out) const {
    const std::string p = layer_prefix(i);
    const int64_t h = c_.hidden_size, d = c_.head_dim, inter = c_.intermediate_size;
    const int64_t nh = c_.num_heads, nkv = c_.num_kv_heads;
    const auto eps = static_cast<float>(c_.rms_norm_eps);
    const std::string x_shape = e.op("Shape", {in}, p + "hidden_shape");

    // Attention.
    const std::string ln1 = rms_norm(e, in, p + "input_layernorm.weight", p + "input_layernorm",
                                     eps, p + "input_layernorm");
    const std::string ln1_rows = rows_of(e, ln1, h, p + "self_attn/input_rows");
    std::string q2, k2, v2;
    if (c_.fused_qkv) {
      const std::string qkv = gemm(e, ln1_rows, p + "self_attn.qkv_proj", c_.qkv_bias);
      const std::string s = p + "self_attn.qkv_proj/";
      q2 = e.op("Slice", {qkv, e.i64({0}), e.i64({nh * d}), e.i64({1})}, s + "q");
      k2 = e.op("Slice", {qkv, e.i64({nh * d}), e.i64({(nh + nkv) * d}), e.i64({1})}, s + "k");
      v2 = e.op("Slice", {qkv, e.i64({(nh + nkv) * d}), e.i64({(nh + 2 * nkv) * d}), e.i64({1})},
                s + "v");
    } else {
      q2 = gemm(e, ln1_rows, p + "self_attn.q_proj", c_.qkv_bias);
      k2 = gemm(e, ln1_rows, p + "self_attn.k_proj", c_.qkv_bias);
      v2 = gemm(e, ln1_rows, p + "self_attn.v_proj", c_.qkv_bias);
    }
    const std::string a = p + "self_attn/";
    std::string q = heads_of(e, f, q2, nh, c_.qk_norm ? p + "self_attn.q_norm.weight" : "",
                             a + "q");
    std::string k = heads_of(e, f, k2, nkv, c_.qk_norm ? p + "self_attn.k_norm.weight" : "",
                             a + "k");
    const std::string v = heads_of(e, f, v2, nkv, "", a + "v");
    q = rope(e, q, d, c_.rotary_dim, a + "q_rope");
    k = rope(e, k, d, c_.rotary_dim, a + "k_rope");
    const std::string kr = repeat_kv(e, k, a + "k_repeat");
    const std::string vr = repeat_kv(e, v, a + "v_repeat");
    const std::string kt = e.op("Transpose", {kr}, a + "k_transpose", {ints("perm", {0, 1, 3, 2})});
    const std::string qk = e.op("MatMul", {q, kt}, a + "scores");
    const auto scaling = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
    const std::string scaled =
        e.op("Mul", {qk, e.f32_scalar(scaling, "attention_scaling")}, a + "scaled_scores");
    const bool sliding = c_.sliding_layers[static_cast<size_t>(i)] && split_bias();
    const std::string bias(sliding ? kDecoderSlidingAttentionBias : kDecoderAttentionBias);
    const std::string masked = e.op("Add", {scaled, bias}, a + "masked_scores");
    const std::string probs = e.op("Softmax", {masked}, a + "probs", {int_attr("axis", -1)});
    const std::string ctx = e.op("MatMul", {probs, vr}, a + "context");
    const std::string ctx_t = e.op("Transpose", {ctx}, a + "context_transpose",
                                   {ints("perm", {0, 2, 1, 3})});
    const std::string o_in = e.op("Reshape", {ctx_t, e.i64({0, 0, nh * d})},
                                  p + "self_attn.o_proj/input");
    const std::string o2 =
        gemm(e, rows_of(e, o_in, nh * d, p + "self_attn.o_proj/input_rows"),
             p + "self_attn.o_proj", c_.o_bias);
    const std::string o3 = e.op("Reshape", {o2, x_shape}, p + "self_attn/output");
    const std::string h1 = e.op("Add", {in, o3}, p + "attention_residual");

    // MLP.
    const std::string ln2 = rms_norm(e, h1, p + "post_attention_layernorm.weight",
                                     p + "post_attention_layernorm", eps,
                                     p + "post_attention_layernorm");
    const std::string ln2_rows = rows_of(e, ln2, h, p + "mlp/input_rows");
    std::string gate, up;
    if (c_.fused_gate_up) {
      const std::string gu = gemm(e, ln2_rows, p + "mlp.gate_up_proj", c_.mlp_bias);
      gate = e.op("Slice", {gu, e.i64({0}), e.i64({inter}), e.i64({1})},
                  p + "mlp.gate_up_proj/gate");
      up = e.op("Slice", {gu, e.i64({inter}), e.i64({2 * inter}), e.i64({1})},
                p + "mlp.gate_up_proj/up");
    } else {
      gate = gemm(e, ln2_rows, p + "mlp.gate_proj", c_.mlp_bias);
      up = gemm(e, ln2_rows, p + "mlp.up_proj", c_.mlp_bias);
    }
    const std::string sig = e.op("Sigmoid", {gate}, p + "mlp/sigmoid");
    const std::string act = e.op("Mul", {gate, sig}, p + "mlp/silu");
    const std::string prod = e.op("Mul", {act, up}, p + "mlp/gated");
    const std::string down_in = to_bt(e, f, prod, {inter}, p + "mlp.down_proj/input");
    const std::string d2 = gemm(e, rows_of(e, down_in, inter, p + "mlp.down_proj/input_rows"),
                                p + "mlp.down_proj", c_.mlp_bias);
    const std::string d3 = e.op("Reshape", {d2, x_shape}, p + "mlp/output");
    e.op("Add", {h1, d3}, p + "mlp_residual", {}, out);
  }

  void emit_epilogue(Emitter& e, const Frame& f, const std::string& hidden) const {
    const std::string n = rms_norm(e, hidden, kFinalNorm, "model.norm",
                                   static_cast<float>(c_.rms_norm_eps), "model.norm");
    const std::string rows = rows_of(e, n, c_.hidden_size, "lm_head/input_rows");
    const std::string w = e.weight(tied_ ? kEmbed : kLmHead);
    const std::string l2 =
        e.op("Gemm", {rows, w}, "lm_head", {int_attr("transB", 1)}, "lm_head/output");
    to_bt(e, f, l2, {c_.vocab_size}, std::string(kDecoderLogits));
  }

  DecoderConfig c_;
  std::unordered_map<std::string, Tensor> weights_;
  bool tied_;
};

}  // namespace

std::unique_ptr<DecoderParts> build_decoder_parts(const DecoderConfig& config,
                                                  const Graph& weights) {
  const DecoderConfig& c = config;
  const bool has_lm_head = weights.has_initializer(kLmHead);
  const bool tied = c.tie_word_embeddings.value_or(!has_lm_head);
  // Every tensor the graph reads, with its shape.
  std::vector<std::pair<std::string, Shape>> expected;
  const int64_t h = c.hidden_size, d = c.head_dim, inter = c.intermediate_size;
  const int64_t q_out = c.num_heads * d, kv_out = c.num_kv_heads * d;
  expected.push_back({kEmbed, {c.vocab_size, h}});
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string p = layer_prefix(i);
    auto linear = [&](const std::string& module, int64_t out, int64_t in, bool bias) {
      expected.push_back({module + ".weight", {out, in}});
      if (bias) expected.push_back({module + ".bias", {out}});
    };
    expected.push_back({p + "input_layernorm.weight", {h}});
    if (c.fused_qkv) {
      linear(p + "self_attn.qkv_proj", q_out + 2 * kv_out, h, c.qkv_bias);
    } else {
      linear(p + "self_attn.q_proj", q_out, h, c.qkv_bias);
      linear(p + "self_attn.k_proj", kv_out, h, c.qkv_bias);
      linear(p + "self_attn.v_proj", kv_out, h, c.qkv_bias);
    }
    if (c.qk_norm) {
      expected.push_back({p + "self_attn.q_norm.weight", {d}});
      expected.push_back({p + "self_attn.k_norm.weight", {d}});
    }
    linear(p + "self_attn.o_proj", h, q_out, c.o_bias);
    expected.push_back({p + "post_attention_layernorm.weight", {h}});
    if (c.fused_gate_up) {
      linear(p + "mlp.gate_up_proj", 2 * inter, h, c.mlp_bias);
    } else {
      linear(p + "mlp.gate_proj", inter, h, c.mlp_bias);
      linear(p + "mlp.up_proj", inter, h, c.mlp_bias);
    }
    linear(p + "mlp.down_proj", h, inter, c.mlp_bias);
  }
  expected.push_back({kFinalNorm, {h}});
  if (!tied) expected.push_back({kLmHead, {c.vocab_size, h}});

  std::unordered_map<std::string, Tensor> used;
  std::unordered_set<std::string> scales;  // of the quantized Linears, read with them
  for (const auto& [name, shape] : expected) {
    const Tensor* t = weights.find_initializer(name);
    if (t == nullptr) {
      std::string why;
      if (name == kLmHead) {
        why = " (config.json has tie_word_embeddings false, so the output projection is its "
              "own tensor)";
      }
      fail_invalid("the " + c.model_type + " decoder needs tensor '" + name +
                   "', which the folder does not hold" + why);
    }
    if (t->shape() != shape) {
      fail_invalid("tensor '" + name + "' has shape " + shape_to_string(t->shape()) +
                   "; config.json makes it " + shape_to_string(shape));
    }
    // A quantized checkpoint's Linear (ir/quantized_linear.h): dequantized here, once, to the
    // float weight its loaders compute (q * scale in the scale's dtype; f32 for a GGUF file), so
    // the graph stays float and runs anywhere (ONNX Runtime, qforge's runtime).
    if (const QuantRecord* r = weights.find_quant_record(name);
        r != nullptr && r->kind == QuantKind::Weight && r->reader.empty()) {
      const std::optional<DType> dtype =
          c.dequantize_in_f32 ? std::optional<DType>(DType::F32) : std::nullopt;
      used.emplace(name, dequantize_quantized_linear(weights, *r, dtype));
      scales.insert(r->scale);
      continue;
    }
    if (!dtype_is_float(t->dtype())) {
      fail_invalid("tensor '" + name + "' is " + std::string(dtype_name(t->dtype())) +
                   ", not a float tensor (a quantized checkpoint?); the decoder graph reads "
                   "float weights");
    }
    used.emplace(name, *t);
  }
  std::vector<std::string> unread;
  for (const auto& [name, t] : weights.initializers())
    if (!used.count(name) && !scales.count(name)) unread.push_back(name);
  if (!unread.empty()) {
    std::string list;
    for (size_t i = 0; i < unread.size() && i < 5; ++i) list += (i ? ", " : "") + unread[i];
    if (unread.size() > 5) list += ", ...";
    spdlog::warn("{} tensor(s) of the folder are not read by the {} decoder graph: {}",
                 unread.size(), c.model_type, list);
  }
  return std::make_unique<HfDecoderParts>(config, std::move(used), tied);
}

std::unique_ptr<DecoderParts> load_decoder_parts(const std::filesystem::path& dir) {
  const DecoderConfig config = read_decoder_config(dir);
  const LoadedModel loaded = load_model(dir);
  return build_decoder_parts(config, loaded.graph);
}

}  // namespace qforge
