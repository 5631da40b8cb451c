#include "quant/lora/weight_binding.h"

#include <algorithm>
#include <cstring>

#include "ir/error.h"
#include "ir/tied_weights.h"
#include "quant/lora/lora_math.h"

namespace qforge {

std::string_view bind_kind_name(BindKind kind) {
  switch (kind) {
    case BindKind::Exact:
      return "name";
    case BindKind::Suffix:
      return "suffix";
    case BindKind::NodeScope:
      return "node-scope";
    case BindKind::Content:
      return "content";
    case BindKind::TransposedContent:
      return "transposed-content";
    case BindKind::FlatName:
      return "flat-name";
    case BindKind::Tied:
      return "tied";
  }
  return "?";
}

std::string list_names(const std::vector<std::string>& names, size_t limit) {
  std::string out;
  for (size_t i = 0; i < names.size() && i < limit; ++i) out += (i ? ", " : "") + names[i];
  if (names.size() > limit) out += " (and " + std::to_string(names.size() - limit) + " more)";
  return out;
}

namespace {

bool is_number(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// Positions just after each separator whose dropped prefix has no numeric component, keeping
// at least two components: the tails a name may be matched by.
std::vector<size_t> tail_starts(const std::string& name, char sep) {
  std::vector<size_t> out;
  size_t start = 0;
  while (true) {
    const size_t next = name.find(sep, start);
    if (next == std::string::npos || is_number(std::string_view(name).substr(start, next - start)))
      break;
    if (name.find(sep, next + 1) == std::string::npos) break;  // one component would remain
    out.push_back(next + 1);
    start = next + 1;
  }
  return out;
}

uint64_t content_hash(std::span<const float> v) {
  uint64_t h = 1469598103934665603ull;
  for (float f : v) {
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    h = (h ^ bits) * 1099511628211ull;
  }
  return h ^ v.size();
}

bool shape_fits(const Shape& init, std::optional<std::span<const int64_t>> torch, bool transposed) {
  if (!torch) return true;
  if (!transposed) return std::equal(init.begin(), init.end(), torch->begin(), torch->end());
  return init.size() == 2 && torch->size() == 2 && init[0] == (*torch)[1] && init[1] == (*torch)[0];
}

constexpr uint64_t kMinContentElements = 16;  // smaller tensors match by chance too easily

}  // namespace

// Names -> ids, found exactly or by a tail (see tail_starts) on either side.
class WeightBinder::Index {
 public:
  explicit Index(char sep) : sep_(sep) {}
  void add(const std::string& name, size_t id) {
    exact_[name].push_back(id);
    for (size_t start : tail_starts(name, sep_)) tails_[name.substr(start)].push_back(id);
  }
  // Ids of the first rule that finds anything (several ids: ambiguous) and whether it was exact.
  std::pair<std::vector<size_t>, bool> find(const std::string& name) const {
    if (auto it = exact_.find(name); it != exact_.end()) return {it->second, true};
    if (auto it = tails_.find(name); it != tails_.end()) return {it->second, false};
    for (size_t start : tail_starts(name, sep_)) {
      const std::string tail = name.substr(start);
      if (auto it = exact_.find(tail); it != exact_.end()) return {it->second, false};
      if (auto it = tails_.find(tail); it != tails_.end()) return {it->second, false};
    }
    return {{}, false};
  }
  bool empty() const { return exact_.empty(); }

 private:
  char sep_;
  std::unordered_map<std::string, std::vector<size_t>> exact_;
  std::unordered_map<std::string, std::vector<size_t>> tails_;
};

WeightBinder::WeightBinder(const Graph& target, BindOptions options)
    : target_(target),
      options_(options),
      names_(std::make_unique<Index>('.')),
      scopes_(std::make_unique<Index>('.')),
      flat_(std::make_unique<Index>('_')),
      reference_names_(std::make_unique<Index>('.')) {
  const auto& inits = target.initializers();
  for (size_t i = 0; i < inits.size(); ++i) {
    const std::string& name = inits[i].first;
    names_->add(name, i);
    if (name.ends_with(".weight")) {
      std::string flat = name.substr(0, name.size() - 7);
      std::replace(flat.begin(), flat.end(), '.', '_');
      flat_->add(flat, i);
    }
  }
  for (const Node& node : target.nodes) {
    if ((node.op_type != "MatMul" && node.op_type != "Gemm") || node.inputs.size() < 2) continue;
    const Tensor* w = target.find_initializer(node.inputs[1]);
    if (w == nullptr || w->rank() != 2 || node.name.size() < 2 || node.name[0] != '/') continue;
    const size_t last = node.name.rfind('/');
    if (last == 0) continue;
    std::string scope = node.name.substr(1, last - 1);
    std::replace(scope.begin(), scope.end(), '/', '.');
    const bool t = node.op_type == "MatMul" || node.attr_int("transB", 0) == 0;
    const WeightBinding b{node.inputs[1], t, BindKind::NodeScope};
    const bool seen = std::any_of(scope_bindings_.begin(), scope_bindings_.end(),
                                  [&](const auto& o) { return o.initializer == b.initializer; });
    if (seen) continue;  // a weight shared by several nodes binds once
    scopes_->add(scope + ".weight", scope_bindings_.size());
    scope_bindings_.push_back(b);
  }
  for (const TiedWeight& tie : tied_weights(target)) {
    if (!target.has_initializer(tie.alias) && target.has_initializer(tie.source)) {
      tied_.emplace(tie.alias, tie.source);
    }
  }
  if (options_.reference != nullptr) {
    const auto& refs = options_.reference->initializers();
    for (size_t i = 0; i < refs.size(); ++i) reference_names_->add(refs[i].first, i);
  }
}

WeightBinder::~WeightBinder() = default;

BindResult WeightBinder::bind(const std::string& torch_name,
                              std::optional<std::span<const int64_t>> torch_shape) const {
  const auto& inits = target_.initializers();
  std::string why;
  if (const auto tie = tied_.find(torch_name); tie != tied_.end()) {
    if (shape_fits(target_.find_initializer(tie->second)->shape(), torch_shape, false)) {
      return {WeightBinding{tie->second, false, BindKind::Tied}, ""};
    }
    why = "tied to '" + tie->second + "', whose shape differs";
  }
  if (auto [ids, exact] = names_->find(torch_name); ids.size() == 1) {
    const auto& [name, tensor] = inits[ids[0]];
    if (shape_fits(tensor.shape(), torch_shape, false)) {
      return {WeightBinding{name, false, exact ? BindKind::Exact : BindKind::Suffix}, ""};
    }
    why = "initializer '" + name + "' has shape " + shape_to_string(tensor.shape()) +
          ", the tensor " + shape_to_string(*torch_shape);
  } else if (ids.size() > 1) {
    std::vector<std::string> names;
    for (size_t id : ids) names.push_back(inits[id].first);
    why = "name matches several initializers: " + list_names(names, 4);
  }
  if (auto [ids, exact] = scopes_->find(torch_name); ids.size() == 1) {
    const WeightBinding& b = scope_bindings_[ids[0]];
    if (shape_fits(target_.find_initializer(b.initializer)->shape(), torch_shape, b.transposed)) {
      return {b, ""};
    }
  }
  BindResult by_value = by_content(torch_name, torch_shape);
  if (by_value.binding) return by_value;
  if (why.empty())
    why = "no initializer of that name" + (by_value.why_not.empty() ? "" : "; " + by_value.why_not);
  return {std::nullopt, why};
}

BindResult WeightBinder::bind_flat(const std::string& flat_module) const {
  auto [ids, exact] = flat_->find(flat_module);
  if (ids.size() == 1) {
    return {WeightBinding{target_.initializers()[ids[0]].first, false, BindKind::FlatName}, ""};
  }
  return {std::nullopt, ids.empty()
                            ? "no '<module>.weight' initializer whose flattened name matches"
                            : "flattened name matches several initializers"};
}

BindResult WeightBinder::by_content(const std::string& torch_name,
                                    std::optional<std::span<const int64_t>> torch_shape) const {
  if (options_.reference == nullptr) return {std::nullopt, ""};
  const auto [ref_ids, exact] = reference_names_->find(torch_name);
  if (ref_ids.size() != 1) return {std::nullopt, "not in the reference state dict"};
  const Tensor& ref = options_.reference->initializers()[ref_ids[0]].second;
  if (!dtype_is_float(ref.dtype()) || ref.numel() < kMinContentElements) {
    return {std::nullopt, "too small to match by content"};
  }
  if (torch_shape && !std::equal(ref.shape().begin(), ref.shape().end(), torch_shape->begin(),
                                 torch_shape->end())) {
    return {std::nullopt, "the reference tensor has another shape"};
  }
  const auto& inits = target_.initializers();
  if (!content_indexed_) {
    for (size_t i = 0; i < inits.size(); ++i) {
      const Tensor& t = inits[i].second;
      if (dtype_is_float(t.dtype()) && t.numel() >= kMinContentElements) {
        content_.emplace(content_hash(t.to_f32()), i);
      }
    }
    content_indexed_ = true;
  }
  const std::vector<float> plain = ref.to_f32();
  std::vector<WeightBinding> found;
  auto collect = [&](const std::vector<float>& values, const Shape& shape, bool t) {
    const auto [lo, hi] = content_.equal_range(content_hash(values));
    for (auto it = lo; it != hi; ++it) {
      const auto& [name, tensor] = inits[it->second];
      if (tensor.shape() == shape && tensor.to_f32() == values) {
        found.push_back({name, t, t ? BindKind::TransposedContent : BindKind::Content});
      }
    }
  };
  collect(plain, ref.shape(), false);
  if (ref.rank() == 2) {
    collect(transpose_2d(plain, ref.shape()[0], ref.shape()[1]), {ref.shape()[1], ref.shape()[0]},
            true);
  }
  if (found.size() == 1) return {found[0], ""};
  if (found.empty()) return {std::nullopt, "no initializer holds its values"};
  std::vector<std::string> names;
  names.reserve(found.size());
  for (const auto& b : found) names.push_back(b.initializer);
  return {std::nullopt, "several initializers hold its values: " + list_names(names, 4)};
}

namespace {

// The state dict tensor in the initializer's orientation and dtype.
Tensor bound_tensor(const Tensor& src, const Tensor& init, bool t, const std::string& where) {
  if (!t && src.dtype() == init.dtype()) return src;
  if (!dtype_is_float(init.dtype()) || init.dtype() == DType::F64 || !dtype_is_float(src.dtype())) {
    fail_unsupported(where + ": cannot convert " + std::string(dtype_name(src.dtype())) +
                     " to the "
                     "initializer's " +
                     std::string(dtype_name(init.dtype())) + "; save the checkpoint in that dtype");
  }
  std::vector<float> v = src.to_f32();
  if (t) v = transpose_2d(v, src.shape()[0], src.shape()[1]);
  return Tensor::from_f32(v, init.shape(), init.dtype());
}

}  // namespace

void bind_weights(Graph& onnx_graph, const Graph& state_dict, const BindOptions& options,
                  PassReport& report) {
  BindOptions opts = options;
  if (opts.reference == nullptr) opts.reference = &state_dict;
  std::vector<std::pair<const std::string*, WeightBinding>> plan;
  std::vector<std::string> unmatched;
  {
    const WeightBinder binder(onnx_graph, opts);
    for (const auto& [name, tensor] : state_dict.initializers()) {
      BindResult r = binder.bind(name, std::span<const int64_t>(tensor.shape()));
      if (r.binding) {
        plan.emplace_back(&name, std::move(*r.binding));
      } else {
        unmatched.push_back(name);
        report.warn("'" + name + "' binds to no initializer: " + r.why_not);
      }
    }
  }
  if (!unmatched.empty() && !options.allow_unmatched) {
    fail_invalid(
        std::to_string(unmatched.size()) + " of " +
        std::to_string(state_dict.initializers().size()) +
        " checkpoint tensors bind to no initializer of the graph: " + list_names(unmatched) +
        "; check that the checkpoint belongs to this model, or allow unmatched tensors");
  }
  std::unordered_map<std::string, Tensor> updates;
  std::unordered_map<std::string, const std::string*> source_of;
  auto rows = nlohmann::ordered_json::array();
  for (const auto& [name, b] : plan) {
    const Tensor& init = *onnx_graph.find_initializer(b.initializer);
    Tensor t =
        bound_tensor(*state_dict.find_initializer(*name), init, b.transposed, "'" + *name + "'");
    auto [it, added] = updates.emplace(b.initializer, t);
    if (!added && !it->second.equals(t)) {
      fail_invalid("checkpoint tensors '" + *source_of[b.initializer] + "' and '" + *name +
                   "' both bind to initializer '" + b.initializer + "' with different values");
    }
    source_of.emplace(b.initializer, name);
    rows.push_back({{"tensor", *name},
                    {"initializer", b.initializer},
                    {"match", bind_kind_name(b.kind)},
                    {"transposed", b.transposed}});
    report.count(std::string("bound_") + std::string(bind_kind_name(b.kind)));
  }
  for (auto& [name, tensor] : updates) onnx_graph.set_initializer(name, std::move(tensor));
  report.count("bound", static_cast<int64_t>(plan.size()));
  report.count("unmatched", static_cast<int64_t>(unmatched.size()));
  report.stats["bindings"] = std::move(rows);
}

}  // namespace qforge
