#include "runtime/op_fusion.h"

#include <cmath>
#include <numbers>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "runtime/ops/activation.h"
#include "runtime/ops/conv.h"
#include "runtime/ops/matmul.h"
#include "runtime/ops/matmul_nbits.h"

namespace qforge {

namespace {

bool default_domain(const Node& node) { return node.domain.empty() || node.domain == "ai.onnx"; }

bool is_op(const Node& node, std::string_view op_type, size_t inputs) {
  return default_domain(node) && node.op_type == op_type && node.inputs.size() == inputs &&
         node.outputs.size() == 1;
}

// What the rewrites ask of the graph: who reads and makes each value, and which constants are
// fixed (an initializer that is also a graph input is a default a feed may replace).
class Uses {
 public:
  // `keep` (may be null): values read as if they were graph outputs.
  Uses(const Graph& g, const std::unordered_set<std::string>* keep)
      : g_(g), readers_(g.consumers()), producer_(g.producers()) {
    for (const auto& v : g.outputs) outputs_.insert(v.name);
    if (keep != nullptr) outputs_.insert(keep->begin(), keep->end());
    for (const auto& v : g.inputs) fed_.insert(v.name);
  }

  // The one node that reads `value`, which is not a graph output (nor kept); nullopt otherwise.
  std::optional<size_t> only_reader(const std::string& value) const {
    const auto it = readers_.find(value);
    if (outputs_.count(value) || it == readers_.end() || it->second.size() != 1) return {};
    return it->second[0];
  }
  // The one node that reads `value`, whether or not it is also a graph output or kept.
  std::optional<size_t> only_node_reader(const std::string& value) const {
    const auto it = readers_.find(value);
    if (it == readers_.end() || it->second.size() != 1) return {};
    return it->second[0];
  }
  // The nodes that read `value` (none: empty), in graph order.
  std::vector<size_t> readers(const std::string& value) const {
    const auto it = readers_.find(value);
    return it == readers_.end() ? std::vector<size_t>{} : it->second;
  }
  // A graph output or kept value: read after the graph (or by an observer) as well.
  bool read_outside(const std::string& value) const { return outputs_.count(value) > 0; }
  std::optional<size_t> producer(const std::string& value) const {
    const auto it = producer_.find(value);
    return it == producer_.end() ? std::nullopt : std::optional<size_t>(it->second);
  }
  const Tensor* constant(const std::string& value) const {
    return fed_.count(value) ? nullptr : g_.find_initializer(value);
  }
  // A constant f32 scalar (any rank, one element).
  std::optional<float> scalar(const std::string& value) const {
    const Tensor* t = constant(value);
    if (t == nullptr || t->dtype() != DType::F32 || t->numel() != 1) return {};
    return t->data<float>()[0];
  }
  bool scalar_near(const std::string& value, double want) const {
    const auto s = scalar(value);
    return s && std::abs(*s - want) <= 1e-6 * std::abs(want);
  }

 private:
  const Graph& g_;
  std::unordered_map<std::string, std::vector<size_t>> readers_;
  std::unordered_map<std::string, size_t> producer_;
  std::unordered_set<std::string> outputs_, fed_;
};

// The operand of a two-input node that is not `value` (which it reads exactly once), or "".
std::string other_input(const Node& node, const std::string& value) {
  if (node.inputs.size() != 2 || (node.inputs[0] == value) == (node.inputs[1] == value)) return {};
  return node.inputs[0] == value ? node.inputs[1] : node.inputs[0];
}

void drop_marked(Graph& g, const std::vector<bool>& drop) {
  std::vector<Node> kept;
  kept.reserve(g.nodes.size());
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    if (!drop[i]) kept.push_back(std::move(g.nodes[i]));
  }
  g.nodes = std::move(kept);
}

// One rewrite's pass over the graph: what reads and makes each value as the pass began; the
// nodes its fusions took are dropped when it finishes.
class Rewrite {
 public:
  Rewrite(Graph& g, const FusionOptions& o)
      : g_(g), uses_(g, o.keep), drop_(g.nodes.size(), false) {}

  const Uses& uses() const { return uses_; }
  // True when no fusion of this pass took any of `nodes`.
  bool available(const std::vector<size_t>& nodes) const {
    for (size_t k : nodes) {
      if (drop_[k] || fused_.count(k)) return false;
    }
    return true;
  }
  // Makes `nodes` one node: `last`, one of them, becomes op_type in `domain`, reading `inputs`,
  // named `name`, with `attributes`, keeping its outputs; the others are dropped. False
  // (nothing changed) where another fusion of this pass took one of them.
  bool fuse(const std::vector<size_t>& nodes, size_t last, std::string op_type,
            std::vector<std::string> inputs, std::string name,
            std::vector<Attribute> attributes = {},
            std::string domain = ops::kInternalDomain) {
    if (!available(nodes)) return false;
    for (size_t k : nodes) drop_[k] = k != last;
    fused_.insert(last);
    Node& fused = g_.nodes[last];
    fused.inputs = std::move(inputs);
    fused.op_type = std::move(op_type);
    fused.domain = std::move(domain);
    fused.name = std::move(name);
    fused.attributes = std::move(attributes);
    return true;
  }
  // Drops the taken nodes; the number of fusions.
  int finish() {
    drop_marked(g_, drop_);
    return static_cast<int>(fused_.size());
  }

 private:
  Graph& g_;
  const Uses uses_;
  std::vector<bool> drop_;
  std::unordered_set<size_t> fused_;
};

int constants_to_initializers(Graph& g) {
  std::unordered_set<std::string> fed;
  for (const auto& v : g.inputs) fed.insert(v.name);
  std::vector<bool> drop(g.nodes.size(), false);
  int n = 0;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& node = g.nodes[i];
    if (!is_op(node, "Constant", 0) || node.attributes.size() != 1) continue;
    const Attribute& a = node.attributes[0];
    const std::string& out = node.outputs[0];
    if (a.name != "value" || a.type != AttrType::Tensor || a.t.empty()) continue;
    if (a.t.dtype() == DType::F16 || a.t.dtype() == DType::BF16) continue;  // HalfCompute's
    if (out.empty() || fed.count(out) || g.has_initializer(out)) continue;
    g.set_initializer(out, a.t);
    drop[i] = true;
    ++n;
  }
  drop_marked(g, drop);
  return n;
}

int fuse_matmul_bias(Graph& g, const FusionOptions& o) {
  Rewrite rw(g, o);
  const Uses& uses = rw.uses();
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& mm = g.nodes[i];
    if (!is_op(mm, "MatMul", 2)) continue;
    const Tensor* w = uses.constant(mm.inputs[1]);
    if (w == nullptr || w->dtype() != DType::F32 || w->rank() != 2) continue;
    const auto add_at = uses.only_reader(mm.outputs[0]);
    if (!add_at || !is_op(g.nodes[*add_at], "Add", 2)) continue;
    const std::string bias = other_input(g.nodes[*add_at], mm.outputs[0]);
    const Tensor* b = bias.empty() ? nullptr : uses.constant(bias);
    if (b == nullptr || b->dtype() != DType::F32 || b->shape() != Shape{w->shape()[1]}) continue;
    // Exact: the bias is added to the finished sums, as the Add does, on a packed weight too.
    std::vector<Attribute> attrs;
    if (o.exact) attrs.push_back(Attribute::make_int(ops::kBiasAfterSumsAttr, 1));
    rw.fuse({i, *add_at}, *add_at, ops::kMatMulBiasOp, {mm.inputs[0], mm.inputs[1], bias},
            mm.name, std::move(attrs));
  }
  return rw.finish();
}

// x * 0.5 * (1 + erf(x / sqrt 2)), found from its Erf.
int fuse_gelu(Graph& g, const FusionOptions& o) {
  Rewrite rw(g, o);
  const Uses& uses = rw.uses();
  constexpr double kSqrt2 = std::numbers::sqrt2;
  for (size_t e = 0; e < g.nodes.size(); ++e) {
    if (!is_op(g.nodes[e], "Erf", 1)) continue;
    const std::string& scaled = g.nodes[e].inputs[0];
    const auto div_at = uses.producer(scaled);
    if (!div_at || uses.only_reader(scaled) != e) continue;
    const Node& div = g.nodes[*div_at];
    std::string x, scale;
    const bool divide = is_op(div, "Div", 2);
    if (divide && uses.scalar_near(div.inputs[1], kSqrt2)) {
      x = div.inputs[0];
      scale = div.inputs[1];
    } else if (is_op(div, "Mul", 2)) {
      for (size_t k = 0; k < 2 && x.empty(); ++k) {
        if (uses.scalar_near(div.inputs[k], 1.0 / kSqrt2)) {
          x = div.inputs[1 - k];
          scale = div.inputs[k];
        }
      }
    }
    if (x.empty()) continue;
    // Exact: the erf's values may be read outside too (an observer's); the fused op then gives
    // them as its second output.
    const std::string erf_out = g.nodes[e].outputs[0];
    const bool erf_outside = o.exact && uses.read_outside(erf_out);
    const auto add_at = erf_outside ? uses.only_node_reader(erf_out) : uses.only_reader(erf_out);
    if (!add_at || !is_op(g.nodes[*add_at], "Add", 2)) continue;
    if (uses.scalar(other_input(g.nodes[*add_at], g.nodes[e].outputs[0])) != 1.0f) continue;
    const std::string& one_plus = g.nodes[*add_at].outputs[0];
    const auto m1_at = uses.only_reader(one_plus);
    if (!m1_at || !is_op(g.nodes[*m1_at], "Mul", 2)) continue;
    const std::string z = other_input(g.nodes[*m1_at], one_plus);
    std::vector<size_t> nodes{*div_at, e, *add_at, *m1_at};
    size_t last = *m1_at;
    if (z == x) {  // (x * (1 + erf)) * 0.5
      const auto m2_at = uses.only_reader(g.nodes[*m1_at].outputs[0]);
      if (!m2_at || !is_op(g.nodes[*m2_at], "Mul", 2)) continue;
      if (uses.scalar(other_input(g.nodes[*m2_at], g.nodes[*m1_at].outputs[0])) != 0.5f) continue;
      last = *m2_at;
      nodes.push_back(last);
    } else {  // (x * 0.5) * (1 + erf)
      const auto h_at = uses.producer(z);
      if (z.empty() || !h_at || uses.only_reader(z) != *m1_at) continue;
      if (!is_op(g.nodes[*h_at], "Mul", 2) || uses.scalar(other_input(g.nodes[*h_at], x)) != 0.5f)
        continue;
      nodes.push_back(*h_at);
    }
    if (o.exact) {  // the exporter's five steps, in their order (ops::kGeluChainOp)
      const bool fused = rw.fuse(nodes, last, ops::kGeluChainOp, {x}, g.nodes[e].name,
                                 {Attribute::make_int("divide", divide ? 1 : 0),
                                  Attribute::make_float("scale", *uses.scalar(scale)),
                                  Attribute::make_int("half_first", z == x ? 0 : 1)});
      if (fused && erf_outside) g.nodes[last].outputs.push_back(erf_out);
    } else {
      rw.fuse(nodes, last, "Gelu", {x}, g.nodes[e].name);
    }
  }
  return rw.finish();
}

// The axes a ReduceMean reduces, where they are fixed: its attribute (before opset 18) or its
// constant input.
std::optional<std::vector<int64_t>> reduce_axes(const Uses& uses, const Node& node) {
  if (const Attribute* a = node.attr("axes"); a != nullptr && a->type == AttrType::Ints) {
    return a->ints;
  }
  if (node.inputs.size() < 2 || node.inputs[1].empty()) return {};
  const Tensor* t = uses.constant(node.inputs[1]);
  if (t == nullptr || t->dtype() != DType::I64) return {};
  const auto v = t->data<int64_t>();
  return std::vector<int64_t>(v.begin(), v.end());
}

// x * (1 / sqrt(mean(x^2, last axis) + eps)) [* w], found from its ReduceMean.
int fuse_rms_norm(Graph& g, const FusionOptions& o) {
  Rewrite rw(g, o);
  const Uses& uses = rw.uses();
  for (size_t rm = 0; rm < g.nodes.size(); ++rm) {
    const Node& mean = g.nodes[rm];
    if (!default_domain(mean) || mean.op_type != "ReduceMean" || mean.outputs.size() != 1 ||
        mean.inputs.empty() || mean.attr_int("keepdims", 1) != 1 ||
        reduce_axes(uses, mean) != std::vector<int64_t>{-1}) {
      continue;
    }
    const std::string& squares = mean.inputs[0];
    const auto sq_at = uses.producer(squares);
    if (!sq_at || uses.only_reader(squares) != rm) continue;
    const Node& sq = g.nodes[*sq_at];
    std::string x;
    if (is_op(sq, "Mul", 2) && sq.inputs[0] == sq.inputs[1]) {
      x = sq.inputs[0];
    } else if (is_op(sq, "Pow", 2) && uses.scalar(sq.inputs[1]) == 2.0f) {
      x = sq.inputs[0];
    }
    if (x.empty()) continue;
    const auto add_at = uses.only_reader(mean.outputs[0]);
    if (!add_at || !is_op(g.nodes[*add_at], "Add", 2)) continue;
    const auto eps = uses.scalar(other_input(g.nodes[*add_at], mean.outputs[0]));
    if (!eps) continue;
    const auto sqrt_at = uses.only_reader(g.nodes[*add_at].outputs[0]);
    if (!sqrt_at || !is_op(g.nodes[*sqrt_at], "Sqrt", 1)) continue;
    const std::string& root = g.nodes[*sqrt_at].outputs[0];
    const auto inv_at = uses.only_reader(root);
    if (!inv_at) continue;
    const Node& inv = g.nodes[*inv_at];
    const bool reciprocal = is_op(inv, "Reciprocal", 1);
    const bool one_over =
        is_op(inv, "Div", 2) && inv.inputs[1] == root && uses.scalar(inv.inputs[0]) == 1.0f;
    if (!reciprocal && !one_over) continue;
    const auto scale_at = uses.only_reader(inv.outputs[0]);
    if (!scale_at || !is_op(g.nodes[*scale_at], "Mul", 2) ||
        other_input(g.nodes[*scale_at], inv.outputs[0]) != x) {
      continue;
    }
    std::vector<size_t> nodes{*sq_at, rm, *add_at, *sqrt_at, *inv_at, *scale_at};
    size_t last = *scale_at;
    std::string weight;
    const std::string& normed = g.nodes[*scale_at].outputs[0];
    if (const auto w_at = uses.only_reader(normed); w_at && is_op(g.nodes[*w_at], "Mul", 2)) {
      const std::string w = other_input(g.nodes[*w_at], normed);
      const Tensor* t = w.empty() ? nullptr : uses.constant(w);
      if (t != nullptr && t->dtype() == DType::F32 && t->rank() == 1) {
        weight = w;
        last = *w_at;
        nodes.push_back(last);
      }
    }
    std::vector<std::string> inputs{x};
    if (!weight.empty()) inputs.push_back(weight);
    rw.fuse(nodes, last, "RmsNorm", std::move(inputs), mean.name,
            {Attribute::make_float("epsilon", *eps)});
  }
  return rw.finish();
}

// Mul(x, Sigmoid(x)), found from its Sigmoid.
int fuse_silu(Graph& g, const FusionOptions& o) {
  Rewrite rw(g, o);
  const Uses& uses = rw.uses();
  for (size_t s = 0; s < g.nodes.size(); ++s) {
    const Node& sig = g.nodes[s];
    if (!is_op(sig, "Sigmoid", 1)) continue;
    const auto mul_at = uses.only_reader(sig.outputs[0]);
    if (!mul_at || !is_op(g.nodes[*mul_at], "Mul", 2) ||
        other_input(g.nodes[*mul_at], sig.outputs[0]) != sig.inputs[0]) {
      continue;
    }
    rw.fuse({s, *mul_at}, *mul_at, "Silu", {sig.inputs[0]}, sig.name);
  }
  return rw.finish();
}

// A name no value of `g` has: `base`, or `base` with a number.
std::string fresh_name(const Graph& g, const std::string& base) {
  std::unordered_set<std::string> taken;
  for (const auto& [name, at] : g.producers()) taken.insert(name);
  for (const auto& v : g.inputs) taken.insert(v.name);
  std::string name = base;
  for (int i = 1; taken.count(name) || g.has_initializer(name); ++i) {
    name = base + "_" + std::to_string(i);
  }
  return name;
}

// Conv(X, W[, B]) -> BatchNormalization(scale, bias, mean, var) in inference form, all constant
// f32, the convolution read by the normalization alone: one Conv whose weights and bias carry
// the normalization, W'[m] = W[m] * s[m] and B'[m] = (B[m] - mean[m]) * s[m] + bias[m] with
// s = scale / sqrt(var + eps), computed in double and rounded once.
int fold_conv_batch_norm(Graph& g, const FusionOptions& o) {
  Rewrite rw(g, o);
  const Uses& uses = rw.uses();
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& conv = g.nodes[i];
    if (!default_domain(conv) || conv.op_type != "Conv" || conv.outputs.size() != 1 ||
        conv.inputs.size() < 2) {
      continue;
    }
    const Tensor* w = uses.constant(conv.inputs[1]);
    if (w == nullptr || w->dtype() != DType::F32 || w->rank() < 3) continue;
    const int64_t m = w->shape()[0];
    const Tensor* b = nullptr;
    if (conv.inputs.size() > 2 && !conv.inputs[2].empty()) {
      b = uses.constant(conv.inputs[2]);
      if (b == nullptr || b->dtype() != DType::F32 || b->shape() != Shape{m}) continue;
    }
    const auto bn_at = uses.only_reader(conv.outputs[0]);
    if (!bn_at || !is_op(g.nodes[*bn_at], "BatchNormalization", 5)) continue;
    const Node& bn = g.nodes[*bn_at];
    if (bn.inputs[0] != conv.outputs[0]) continue;
    bool training = false;
    float eps = 1e-5f;
    for (const Attribute& a : bn.attributes) {
      if (a.name == "training_mode") training = a.i != 0;
      if (a.name == "epsilon") eps = a.f;
    }
    std::vector<const Tensor*> p;
    for (size_t k = 1; k < 5; ++k) {
      const Tensor* t = uses.constant(bn.inputs[k]);
      if (t == nullptr || t->dtype() != DType::F32 || t->shape() != Shape{m}) break;
      p.push_back(t);
    }
    if (training || p.size() != 4 || !rw.available({i, *bn_at})) continue;
    const auto scale = p[0]->data<float>(), shift = p[1]->data<float>();
    const auto mean = p[2]->data<float>(), var = p[3]->data<float>();
    Tensor w2(DType::F32, w->shape()), b2(DType::F32, {m});
    const auto wv = w->data<float>();
    auto w2v = w2.mutable_data<float>();
    auto b2v = b2.mutable_data<float>();
    const auto per = static_cast<int64_t>(w->numel()) / m;
    for (int64_t c = 0; c < m; ++c) {
      const auto u = static_cast<size_t>(c);
      const double s = scale[u] / std::sqrt(static_cast<double>(var[u]) + eps);
      for (int64_t k = 0; k < per; ++k) {
        const auto at = static_cast<size_t>(c * per + k);
        w2v[at] = static_cast<float>(wv[at] * s);
      }
      const double bias0 = b != nullptr ? b->data<float>()[u] : 0.0;
      b2v[u] = static_cast<float>((bias0 - mean[u]) * s + shift[u]);
    }
    const std::string wname = fresh_name(g, conv.inputs[1] + "_bn_folded");
    g.set_initializer(wname, std::move(w2));
    const std::string bname = fresh_name(g, conv.outputs[0] + "_bn_folded_bias");
    g.set_initializer(bname, std::move(b2));
    rw.fuse({i, *bn_at}, *bn_at, "Conv", {conv.inputs[0], wname, bname}, conv.name,
            conv.attributes, conv.domain);
  }
  return rw.finish();
}

// X -> Relu, X's output read by that Relu alone (`is_x` says which nodes are X): one `fused_op`
// with X's inputs, name and attributes.
int fuse_then_relu(Graph& g, const FusionOptions& o, bool (*is_x)(const Node&),
                   const std::string& fused_op) {
  Rewrite rw(g, o);
  const Uses& uses = rw.uses();
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& x = g.nodes[i];
    if (!is_x(x)) continue;
    const auto relu_at = uses.only_reader(x.outputs[0]);
    if (!relu_at || !is_op(g.nodes[*relu_at], "Relu", 1)) continue;
    rw.fuse({i, *relu_at}, *relu_at, fused_op, x.inputs, x.name, x.attributes);
  }
  return rw.finish();
}

// Conv -> Relu: the kernel stores through the Relu.
bool is_conv(const Node& n) {
  return default_domain(n) && n.op_type == "Conv" && n.outputs.size() == 1;
}
// Add -> Relu (a residual connection's): one pass.
bool is_add(const Node& n) { return is_op(n, "Add", 2); }

// Conv -> AddRelu (a residual connection: Relu(Conv(x) + z)), the convolution read by that
// AddRelu alone and not its other operand too: one ConvAddRelu(X, W, B or "", Z) with the
// Conv's name and attributes in the AddRelu's place (where Z is already made).
int fuse_conv_add_relu(Graph& g, const FusionOptions& o) {
  Rewrite rw(g, o);
  const Uses& uses = rw.uses();
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& add = g.nodes[i];
    if (add.domain != ops::kInternalDomain || add.op_type != "AddRelu" ||
        add.inputs.size() != 2 || add.inputs[0] == add.inputs[1]) {
      continue;
    }
    for (size_t side = 0; side < 2; ++side) {
      const std::string& v = add.inputs[side];
      const auto conv_at = uses.producer(v);
      if (!conv_at || !is_conv(g.nodes[*conv_at]) || uses.only_reader(v) != i) continue;
      const Node& conv = g.nodes[*conv_at];
      std::vector<std::string> inputs = conv.inputs;  // X, W[, B]
      inputs.resize(3);                               // "": no bias
      inputs.push_back(add.inputs[1 - side]);
      if (rw.fuse({*conv_at, i}, i, ops::kConvAddReluOp, std::move(inputs), conv.name,
                  conv.attributes)) {
        break;
      }
    }
  }
  return rw.finish();
}

// Softmax over the last axis of (x * c or x / c, c a constant f32 scalar) + bias, either or
// both present (attention's scores: scaled, masked, normalized): one pass per row with the
// three ops' roundings in their order (ops::kScaleAddSoftmaxOp), so exact.
int fuse_scale_add_softmax(Graph& g, const FusionOptions& o) {
  Rewrite rw(g, o);
  const Uses& uses = rw.uses();
  if (g.opset("") < 13) return 0;  // before 13, Softmax reduces a coerced 2-D block
  for (size_t sm = 0; sm < g.nodes.size(); ++sm) {
    const Node& softmax = g.nodes[sm];
    if (!is_op(softmax, "Softmax", 1)) continue;
    const Attribute* axis = softmax.attr("axis");
    if (axis != nullptr && (axis->type != AttrType::Int || axis->i != -1)) continue;
    std::vector<size_t> nodes{sm};
    std::string x = softmax.inputs[0], scale, bias;
    bool divide = false;
    if (const auto add_at = uses.producer(x);
        add_at && uses.only_reader(x) == sm && is_op(g.nodes[*add_at], "Add", 2)) {
      const Node& add = g.nodes[*add_at];
      // The scaled operand is the one a Mul or Div by a constant scalar makes, read here alone.
      size_t k = 0;
      for (; k < 2; ++k) {
        const auto at = uses.producer(add.inputs[k]);
        if (!at || uses.only_reader(add.inputs[k]) != *add_at) continue;
        const Node& m = g.nodes[*at];
        if ((is_op(m, "Mul", 2) || is_op(m, "Div", 2)) && uses.scalar(m.inputs[1])) break;
      }
      nodes.push_back(*add_at);
      bias = add.inputs[k < 2 ? 1 - k : 1];
      x = add.inputs[k < 2 ? k : 0];
    }
    if (const auto m_at = uses.producer(x); m_at && uses.only_reader(x) == nodes.back()) {
      const Node& m = g.nodes[*m_at];
      if ((is_op(m, "Mul", 2) || is_op(m, "Div", 2)) && uses.scalar(m.inputs[1])) {
        nodes.push_back(*m_at);
        divide = m.op_type == "Div";
        scale = m.inputs[1];
        x = m.inputs[0];
      }
    }
    if (nodes.size() < 2) continue;
    rw.fuse(nodes, sm, ops::kScaleAddSoftmaxOp, {x, scale, bias}, softmax.name,
            {Attribute::make_int("divide", divide ? 1 : 0)});
  }
  return rw.finish();
}

// A NaN guard between attention's softmax and its second product, as exporters write it:
// Where(IsNaN(p), c, p) making `value` (read by node `reader` alone), c a constant f32 scalar,
// the IsNaN read by the Where alone and p by those two alone.
struct NanGuard {
  size_t is_nan, where;
  std::string probs, value;  // p and c
};

std::optional<NanGuard> nan_guard(const Graph& g, const Uses& uses, const std::string& value,
                                  size_t reader) {
  const auto wh_at = uses.producer(value);
  if (!wh_at || uses.only_reader(value) != reader || !is_op(g.nodes[*wh_at], "Where", 3)) {
    return std::nullopt;
  }
  const Node& wh = g.nodes[*wh_at];
  const auto nan_at = uses.producer(wh.inputs[0]);
  const Tensor* c = uses.constant(wh.inputs[1]);
  if (!nan_at || !is_op(g.nodes[*nan_at], "IsNaN", 1) ||
      g.nodes[*nan_at].inputs[0] != wh.inputs[2] || uses.only_reader(wh.inputs[0]) != *wh_at ||
      c == nullptr || c->dtype() != DType::F32 || c->numel() != 1 || c->rank() > 1 ||
      uses.read_outside(wh.inputs[2]) ||
      uses.readers(wh.inputs[2]) !=
          std::vector<size_t>{std::min(*nan_at, *wh_at), std::max(*nan_at, *wh_at)}) {
    return std::nullopt;
  }
  return NanGuard{.is_nan = *nan_at, .where = *wh_at, .probs = wh.inputs[2],
                  .value = wh.inputs[1]};
}

// Attention: MatMul(Q, K') -> ScaleAddSoftmax (or a Softmax over the last axis) -> MatMul(., V),
// each result read by the next alone (or through a NaN guard: nan_guard, taken as input 5), K'
// and V computed (not constants): one qforge.internal Attention (ops::kAttentionOp), with the
// keys' Transpose where K' is one that swaps the last two dims of K and is read by the product
// alone. The same bits (the op computes the unfused ops' elements and rows), so exact.
int fuse_attention(Graph& g, const FusionOptions& o) {
  Rewrite rw(g, o);
  const Uses& uses = rw.uses();
  const bool opset13 = g.opset("") >= 13;  // before 13, Softmax reduces a coerced 2-D block
  for (size_t pv = 0; pv < g.nodes.size(); ++pv) {
    const Node& context = g.nodes[pv];
    if (!is_op(context, "MatMul", 2) || uses.constant(context.inputs[1]) != nullptr) continue;
    const std::optional<NanGuard> guard = nan_guard(g, uses, context.inputs[0], pv);
    const std::string& probs = guard ? guard->probs : context.inputs[0];
    const auto sm_at = uses.producer(probs);
    if (!sm_at || (!guard && uses.only_reader(probs) != pv)) continue;
    const Node& sm = g.nodes[*sm_at];
    std::string scale, bias;
    std::vector<Attribute> attributes;
    if (sm.domain == ops::kInternalDomain && sm.op_type == ops::kScaleAddSoftmaxOp &&
        sm.outputs.size() == 1 && sm.inputs.size() == 3) {
      scale = sm.inputs[1];
      bias = sm.inputs[2];
      if (const Attribute* divide = sm.attr("divide")) attributes.push_back(*divide);
    } else if (is_op(sm, "Softmax", 1) && opset13) {
      const Attribute* axis = sm.attr("axis");
      if (axis != nullptr && (axis->type != AttrType::Int || axis->i != -1)) continue;
    } else {
      continue;
    }
    const std::string& scores = sm.inputs[0];
    const auto qk_at = uses.producer(scores);
    if (!qk_at || uses.only_reader(scores) != *sm_at || !is_op(g.nodes[*qk_at], "MatMul", 2)) {
      continue;
    }
    const Node& qk = g.nodes[*qk_at];
    std::string keys = qk.inputs[1];
    if (uses.constant(keys) != nullptr) continue;
    std::vector<size_t> nodes{*qk_at, *sm_at, pv};
    if (guard) nodes.insert(nodes.end(), {guard->is_nan, guard->where});
    if (const auto tr_at = uses.producer(keys);
        tr_at && uses.only_reader(keys) == *qk_at && is_op(g.nodes[*tr_at], "Transpose", 1)) {
      const Attribute* perm = g.nodes[*tr_at].attr("perm");
      if (perm != nullptr && perm->type == AttrType::Ints && ops::swaps_last_two(perm->ints)) {
        nodes.push_back(*tr_at);
        keys = g.nodes[*tr_at].inputs[0];
        attributes.push_back(*perm);
      }
    }
    std::vector<std::string> inputs{qk.inputs[0], keys, scale, bias, context.inputs[1]};
    if (guard) inputs.push_back(guard->value);
    rw.fuse(nodes, pv, ops::kAttentionOp, std::move(inputs), context.name,
            std::move(attributes));
  }
  return rw.finish();
}

}  // namespace

FusedOps fuse_float_ops(Graph& graph, const FusionOptions& options) {
  FusedOps f;
  f.constants = constants_to_initializers(graph);
  f.matmul_bias = fuse_matmul_bias(graph, options);
  f.gelu = fuse_gelu(graph, options);
  if (!options.exact) f.rms_norm = fuse_rms_norm(graph, options);
  f.silu = fuse_silu(graph, options);
  if (!options.exact) f.conv_batch_norm = fold_conv_batch_norm(graph, options);
  f.conv_relu = fuse_then_relu(graph, options, is_conv, ops::kConvReluOp);
  f.add_relu = fuse_then_relu(graph, options, is_add, "AddRelu");
  f.conv_add_relu = fuse_conv_add_relu(graph, options);
  f.softmax = fuse_scale_add_softmax(graph, options);
  if (options.attention) f.attention = fuse_attention(graph, options);
  return f;
}

}  // namespace qforge
