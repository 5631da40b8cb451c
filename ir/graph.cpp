#include "ir/graph.h"

#include <algorithm>
#include <queue>
#include <set>
#include <unordered_set>

#include "ir/error.h"

namespace qforge {

Attribute Attribute::make_int(std::string name, int64_t v) {
  Attribute a;
  a.name = std::move(name);
  a.type = AttrType::Int;
  a.i = v;
  return a;
}
Attribute Attribute::make_float(std::string name, float v) {
  Attribute a;
  a.name = std::move(name);
  a.type = AttrType::Float;
  a.f = v;
  return a;
}
Attribute Attribute::make_string(std::string name, std::string v) {
  Attribute a;
  a.name = std::move(name);
  a.type = AttrType::String;
  a.s = std::move(v);
  return a;
}
Attribute Attribute::make_ints(std::string name, std::vector<int64_t> v) {
  Attribute a;
  a.name = std::move(name);
  a.type = AttrType::Ints;
  a.ints = std::move(v);
  return a;
}

const Attribute* Node::attr(std::string_view attr_name) const {
  for (const auto& a : attributes) {
    if (a.name == attr_name) return &a;
  }
  return nullptr;
}
int64_t Node::attr_int(std::string_view attr_name, int64_t fallback) const {
  const Attribute* a = attr(attr_name);
  return (a != nullptr && a->type == AttrType::Int) ? a->i : fallback;
}
float Node::attr_float(std::string_view attr_name, float fallback) const {
  const Attribute* a = attr(attr_name);
  return (a != nullptr && a->type == AttrType::Float) ? a->f : fallback;
}
void Node::set_attr(Attribute a) {
  for (auto& existing : attributes) {
    if (existing.name == a.name) {
      existing = std::move(a);
      return;
    }
  }
  attributes.push_back(std::move(a));
}
std::string Node::label() const {
  const std::string op = domain.empty() ? op_type : domain + "." + op_type;
  return op + " '" + name + "'";
}

const Tensor* Graph::find_initializer(std::string_view tensor_name) const {
  const auto it = init_index_.find(std::string(tensor_name));
  return it == init_index_.end() ? nullptr : &inits_[it->second].second;
}
Tensor* Graph::find_initializer(std::string_view tensor_name) {
  const auto it = init_index_.find(std::string(tensor_name));
  return it == init_index_.end() ? nullptr : &inits_[it->second].second;
}
bool Graph::has_initializer(std::string_view tensor_name) const {
  return init_index_.count(std::string(tensor_name)) != 0;
}
void Graph::set_initializer(const std::string& tensor_name, Tensor tensor) {
  const auto it = init_index_.find(tensor_name);
  if (it != init_index_.end()) {
    inits_[it->second].second = std::move(tensor);
    return;
  }
  init_index_[tensor_name] = inits_.size();
  inits_.emplace_back(tensor_name, std::move(tensor));
}
void Graph::remove_initializer(std::string_view tensor_name) {
  const auto it = init_index_.find(std::string(tensor_name));
  if (it == init_index_.end()) return;
  inits_.erase(inits_.begin() + static_cast<std::ptrdiff_t>(it->second));
  init_index_.clear();
  for (size_t i = 0; i < inits_.size(); ++i) init_index_[inits_[i].first] = i;
  std::erase_if(quant_records_, [&](const QuantRecord& r) { return r.name == tensor_name; });
}

const QuantRecord* Graph::find_quant_record(std::string_view tensor_name) const {
  for (const auto& r : quant_records_) {
    if (r.name == tensor_name) return &r;
  }
  return nullptr;
}
void Graph::add_quant_record(QuantRecord record) {
  for (auto& r : quant_records_) {
    if (r.name == record.name) {
      r = std::move(record);
      return;
    }
  }
  quant_records_.push_back(std::move(record));
}
void Graph::rename_in_quant_records(const std::string& from, const std::string& to) {
  for (auto& r : quant_records_) {
    for (std::string* field : {&r.name, &r.scale, &r.zero_point, &r.reader}) {
      if (*field == from) *field = to;
    }
  }
}
void Graph::retarget_quant_records(const std::string& reader, const std::string& from,
                                   const std::string& to) {
  for (auto& r : quant_records_) {
    if (r.reader != reader) continue;
    for (std::string* field : {&r.name, &r.scale, &r.zero_point}) {
      if (*field == from) *field = to;
    }
  }
}
void Graph::check_quant_records() const {
  std::unordered_map<std::string, const Node*> by_first_output;
  for (const auto& n : nodes) {
    if (!n.outputs.empty() && !n.outputs[0].empty()) by_first_output.emplace(n.outputs[0], &n);
  }
  for (const auto& r : quant_records_) {
    const std::string what = std::string(quant_kind_name(r.kind)) + " record '" + r.name + "'";
    if (r.reader.empty() && nodes.empty()) {
      // A weights-only graph (ir/quantized_linear.h): no node reads the tensors.
      for (const std::string* tensor : {&r.name, &r.scale}) {
        if (!has_initializer(*tensor)) fail_internal(what + ": no initializer '" + *tensor + "'");
      }
      continue;
    }
    const auto it = by_first_output.find(r.reader);
    if (it == by_first_output.end()) {
      fail_internal(what + " names reader '" + r.reader + "', which no node produces");
    }
    const Node& reader = *it->second;
    for (const std::string* tensor : {&r.name, &r.scale, &r.zero_point}) {
      if (tensor->empty() && tensor != &r.name) continue;
      if (std::find(reader.inputs.begin(), reader.inputs.end(), *tensor) == reader.inputs.end()) {
        fail_internal(what + ": node " + reader.label() + " does not read '" + *tensor + "'");
      }
    }
    if (r.kind == QuantKind::Weight && !has_initializer(r.name)) {
      fail_internal(what + " is no initializer of the graph");
    }
  }
}

int64_t Graph::opset(std::string_view domain) const {
  const auto it = opset_imports.find(std::string(domain));
  if (it != opset_imports.end()) return it->second;
  if (domain.empty()) {  // "ai.onnx" is an alias of the default domain
    const auto alias = opset_imports.find("ai.onnx");
    if (alias != opset_imports.end()) return alias->second;
  }
  return 0;
}
const std::string* Graph::find_metadata(std::string_view key) const {
  for (const auto& [k, v] : metadata) {
    if (k == key) return &v;
  }
  return nullptr;
}
void Graph::set_metadata(const std::string& key, std::string value) {
  for (auto& [k, v] : metadata) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  metadata.emplace_back(key, std::move(value));
}

std::unordered_map<std::string, size_t> Graph::producers() const {
  std::unordered_map<std::string, size_t> out;
  for (size_t i = 0; i < nodes.size(); ++i) {
    for (const auto& o : nodes[i].outputs) {
      if (!o.empty()) out.emplace(o, i);
    }
  }
  return out;
}
std::unordered_map<std::string, std::vector<size_t>> Graph::consumers() const {
  std::unordered_map<std::string, std::vector<size_t>> out;
  for (size_t i = 0; i < nodes.size(); ++i) {
    for (const auto& in : nodes[i].inputs) {
      if (!in.empty()) out[in].push_back(i);
    }
  }
  return out;
}

namespace {

void collect_names(const Graph& g, std::unordered_set<std::string>& names) {
  for (const auto& v : g.inputs) names.insert(v.name);
  for (const auto& v : g.outputs) names.insert(v.name);
  for (const auto& v : g.value_info) names.insert(v.name);
  for (const auto& [n, t] : g.initializers()) names.insert(n);
  for (const auto& node : g.nodes) {
    names.insert(node.name);
    for (const auto& s : node.inputs) names.insert(s);
    for (const auto& s : node.outputs) names.insert(s);
    for (const auto& a : node.attributes) {
      if (a.g) collect_names(*a.g, names);
      for (const auto& sub : a.graphs) collect_names(*sub, names);
    }
  }
}

// Values a subgraph reads from its enclosing scopes.
void outer_reads(const Graph& g, std::set<std::string>& out) {
  std::unordered_set<std::string> defined;
  for (const auto& v : g.inputs) defined.insert(v.name);
  for (const auto& [n, t] : g.initializers()) defined.insert(n);
  for (const auto& node : g.nodes) {
    for (const auto& in : node.inputs) {
      if (!in.empty() && !defined.count(in)) out.insert(in);
    }
    for (const auto& a : node.attributes) {
      std::set<std::string> inner;
      if (a.g) outer_reads(*a.g, inner);
      for (const auto& sub : a.graphs) outer_reads(*sub, inner);
      for (const auto& n : inner) {
        if (!defined.count(n)) out.insert(n);
      }
    }
    for (const auto& o : node.outputs) defined.insert(o);
  }
  for (const auto& v : g.outputs) {
    if (!defined.count(v.name)) out.insert(v.name);
  }
}

// Every value a node reads: its inputs and what its subgraphs read from outside.
std::vector<std::string> node_reads(const Node& node) {
  std::vector<std::string> reads;
  for (const auto& in : node.inputs) {
    if (!in.empty()) reads.push_back(in);
  }
  std::set<std::string> inner;
  for (const auto& a : node.attributes) {
    if (a.g) outer_reads(*a.g, inner);
    for (const auto& sub : a.graphs) outer_reads(*sub, inner);
  }
  reads.insert(reads.end(), inner.begin(), inner.end());
  return reads;
}

std::string dims_to_string(const std::vector<Dim>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i) s += ", ";
    s += dims[i].value ? std::to_string(*dims[i].value)
                       : (dims[i].param.empty() ? "?" : dims[i].param);
  }
  return s + "]";
}

}  // namespace

std::unordered_set<std::string> Graph::names_in_use() const {
  std::unordered_set<std::string> names;
  collect_names(*this, names);
  return names;
}

std::string Graph::unique_name(const std::string& hint) const {
  const std::unordered_set<std::string> names = names_in_use();
  if (!names.count(hint)) return hint;
  for (int i = 1;; ++i) {
    std::string candidate = hint + "_" + std::to_string(i);
    if (!names.count(candidate)) return candidate;
  }
}

std::string UniqueNames::take(const std::string& hint) {
  if (names_.insert(hint).second) return hint;
  for (int i = 1;; ++i) {
    std::string candidate = hint + "_" + std::to_string(i);
    if (names_.insert(candidate).second) return candidate;
  }
}

void Graph::check(const std::vector<std::string>& outer_scope) const {
  std::unordered_set<std::string> defined(outer_scope.begin(), outer_scope.end());
  std::unordered_map<std::string, std::string> definer;  // value -> who defines it
  auto define = [&](const std::string& value, const std::string& who) {
    const auto it = definer.find(value);
    if (it != definer.end()) {
      fail_invalid("value '" + value + "' is produced twice: by " + it->second + " and by " + who);
    }
    definer.emplace(value, who);
    defined.insert(value);
  };
  for (const auto& v : inputs) {
    if (v.name.empty()) fail_invalid("graph '" + name + "' has an input with an empty name");
    define(v.name, "graph input");
  }
  for (const auto& [n, t] : inits_) {
    if (definer.count(n) && definer[n] == "graph input") continue;  // initializer as default
    define(n, "initializer");
  }
  // Declared types of initializers must agree with the tensors.
  auto check_decl = [&](const ValueInfo& v) {
    const Tensor* t = find_initializer(v.name);
    if (t == nullptr) return;
    if (v.dtype && *v.dtype != t->dtype()) {
      fail_invalid("initializer '" + v.name + "' is " + std::string(dtype_name(t->dtype())) +
                   " but declared " + std::string(dtype_name(*v.dtype)));
    }
    if (v.shape) {
      bool match = v.shape->size() == t->rank();
      for (size_t i = 0; match && i < v.shape->size(); ++i) {
        const auto& d = (*v.shape)[i];
        if (d.value && *d.value != t->shape()[i]) match = false;
      }
      if (!match) {
        fail_invalid("initializer '" + v.name + "' has shape " + shape_to_string(t->shape()) +
                     " but is declared " + dims_to_string(*v.shape));
      }
    }
  };
  for (const auto& v : inputs) check_decl(v);
  for (const auto& v : value_info) check_decl(v);

  const auto produced_by = producers();
  std::vector<std::string> scope_for_subgraphs;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node& node = nodes[i];
    for (const auto& in : node_reads(node)) {
      if (defined.count(in)) continue;
      const auto p = produced_by.find(in);
      if (p != produced_by.end() && p->second >= i) {
        Graph copy_for_cycle = *this;
        copy_for_cycle.topological_sort();  // throws naming a node when there is a cycle
        fail_invalid("node " + node.label() + " reads '" + in + "' before node " +
                     nodes[p->second].label() + " produces it: nodes are not in topological order");
      }
      fail_invalid("node " + node.label() + " reads '" + in +
                   "', which no graph input, initializer or earlier node defines");
    }
    if (node.op_type.empty()) fail_invalid("node '" + node.name + "' has no op_type");
    bool has_subgraph = false;
    for (const auto& a : node.attributes) has_subgraph |= (a.g != nullptr) || !a.graphs.empty();
    if (has_subgraph) {
      std::vector<std::string> scope(defined.begin(), defined.end());
      for (const auto& a : node.attributes) {
        if (a.g) a.g->check(scope);
        for (const auto& sub : a.graphs) sub->check(scope);
      }
    }
    for (const auto& o : node.outputs) {
      if (!o.empty()) define(o, "node " + node.label());
    }
  }
  for (const auto& v : outputs) {
    if (!defined.count(v.name)) {
      fail_invalid("graph output '" + v.name +
                   "' is not produced by any node, input or initializer");
    }
  }
}

void Graph::topological_sort() {
  const size_t n = nodes.size();
  std::unordered_map<std::string, size_t> produced_by = producers();
  std::vector<std::vector<size_t>> users(n);
  std::vector<size_t> pending(n, 0);
  for (size_t i = 0; i < n; ++i) {
    std::unordered_set<size_t> deps;
    for (const auto& in : node_reads(nodes[i])) {
      const auto p = produced_by.find(in);
      if (p != produced_by.end()) deps.insert(p->second);
    }
    for (size_t d : deps) {
      users[d].push_back(i);
      ++pending[i];
    }
  }
  std::priority_queue<size_t, std::vector<size_t>, std::greater<>> ready;  // stable: lowest index
  for (size_t i = 0; i < n; ++i) {
    if (pending[i] == 0) ready.push(i);
  }
  std::vector<size_t> order;
  order.reserve(n);
  while (!ready.empty()) {
    const size_t i = ready.top();
    ready.pop();
    order.push_back(i);
    for (size_t u : users[i]) {
      if (--pending[u] == 0) ready.push(u);
    }
  }
  if (order.size() != n) {
    for (size_t i = 0; i < n; ++i) {
      if (pending[i] != 0) fail_invalid("node " + nodes[i].label() + " is on a cycle");
    }
  }
  std::vector<Node> sorted;
  sorted.reserve(n);
  for (size_t i : order) sorted.push_back(std::move(nodes[i]));
  nodes = std::move(sorted);
}

uint64_t Graph::parameter_count() const {
  uint64_t total = 0;
  for (const auto& [n, t] : inits_) total += t.numel();
  return total;
}
uint64_t Graph::parameter_bytes() const {
  uint64_t total = 0;
  for (const auto& [n, t] : inits_) total += t.nbytes();
  return total;
}

}  // namespace qforge
