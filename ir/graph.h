#pragma once
// The graph IR. Node semantics are ONNX's: an op is (domain, op_type) with ONNX attributes,
// values are named edges, nodes are kept in topological order. A weights-only model (a state
// dict, a safetensors file) is a Graph with initializers and no nodes.
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <variant>
#include <vector>

#include "ir/quant_record.h"
#include "ir/tensor.h"

namespace qforge {

class Graph;

// A dimension: a fixed size, a symbolic name ("batch"), or unknown.
struct Dim {
  std::optional<int64_t> value;
  std::string param;
  bool operator==(const Dim&) const = default;
};

// What is known of a value: its name, element type and shape (rank unknown if no shape).
struct ValueInfo {
  std::string name;
  std::optional<DType> dtype;
  std::optional<std::vector<Dim>> shape;
  std::string doc_string;
  bool operator==(const ValueInfo&) const = default;
};

enum class AttrType { Float, Int, String, Tensor, Graph, Floats, Ints, Strings, Tensors, Graphs };

struct Attribute {
  std::string name;
  AttrType type = AttrType::Int;
  float f = 0.0f;
  int64_t i = 0;
  std::string s;  // bytes for String
  Tensor t;
  std::shared_ptr<Graph> g;
  std::vector<float> floats;
  std::vector<int64_t> ints;
  std::vector<std::string> strings;
  std::vector<Tensor> tensors;
  std::vector<std::shared_ptr<Graph>> graphs;
  std::string doc_string;

  static Attribute make_int(std::string name, int64_t v);
  static Attribute make_float(std::string name, float v);
  static Attribute make_string(std::string name, std::string v);
  static Attribute make_ints(std::string name, std::vector<int64_t> v);
};

struct Node {
  std::string name;
  std::string op_type;
  std::string domain;                // "" is the default ONNX domain
  std::vector<std::string> inputs;   // "" marks an absent optional input
  std::vector<std::string> outputs;  // "" marks an absent optional output
  std::vector<Attribute> attributes;
  std::string doc_string;

  const Attribute* attr(std::string_view attr_name) const;
  int64_t attr_int(std::string_view attr_name, int64_t fallback) const;
  float attr_float(std::string_view attr_name, float fallback) const;
  void set_attr(Attribute a);  // replaces an attribute of the same name
  std::string label() const;   // "Conv 'conv1'" for messages
};

// Top-level model fields that ONNX carries beside the graph.
struct ModelProps {
  int64_t ir_version = 8;
  std::string producer_name;
  std::string producer_version;
  std::string domain;
  int64_t model_version = 0;
  std::string doc_string;
};

class Graph {
 public:
  std::string name;
  std::string doc_string;
  std::vector<Node> nodes;
  std::vector<ValueInfo> inputs;
  std::vector<ValueInfo> outputs;
  std::vector<ValueInfo> value_info;
  std::map<std::string, int64_t> opset_imports;               // domain -> version
  std::vector<std::pair<std::string, std::string>> metadata;  // metadata_props, in order
  ModelProps model;

  // Initializers keep insertion order (so export is deterministic) with lookup by name.
  const Tensor* find_initializer(std::string_view tensor_name) const;
  Tensor* find_initializer(std::string_view tensor_name);
  bool has_initializer(std::string_view tensor_name) const;
  void set_initializer(const std::string& tensor_name, Tensor tensor);  // add or replace
  void remove_initializer(std::string_view tensor_name);
  const std::vector<std::pair<std::string, Tensor>>& initializers() const { return inits_; }
  // Names of initializers that are also listed as graph inputs are legal (ONNX IR < 4 style).
  // Removing an initializer drops the quantized-tensor record stored under its name.

  // Quantized-tensor records (ir/quant_record.h), in the order they were added, one per stored
  // tensor name. Passes that rename or rewire values keep them true with the two calls below.
  const std::vector<QuantRecord>& quant_records() const { return quant_records_; }
  const QuantRecord* find_quant_record(std::string_view tensor_name) const;
  void add_quant_record(QuantRecord record);  // replaces the record of the same name
  // A value renamed everywhere: every record field naming `from` names `to`.
  void rename_in_quant_records(const std::string& from, const std::string& to);
  // The node whose first output is `reader` now reads `to` where it read `from` (e.g. a
  // converted copy of a scale): the records it reads follow.
  void retarget_quant_records(const std::string& reader, const std::string& from,
                              const std::string& to);
  // Throws Error(Internal) naming the record when a record contradicts the graph: its reader is
  // missing or does not read its tensors, or a weight's tensor is no initializer. Exporters call
  // it before writing, since a stale record would put a wrong description beside right data.
  void check_quant_records() const;

  int64_t opset(std::string_view domain = "") const;  // 0 if not imported
  void set_opset(const std::string& domain, int64_t version) { opset_imports[domain] = version; }
  const std::string* find_metadata(std::string_view key) const;
  void set_metadata(const std::string& key, std::string value);

  // Index: value name -> index of the node producing it (graph inputs/initializers: absent).
  std::unordered_map<std::string, size_t> producers() const;
  // Value name -> indices of the nodes consuming it.
  std::unordered_map<std::string, std::vector<size_t>> consumers() const;
  // Every name used anywhere in the graph, subgraphs included: values, nodes, initializers.
  std::unordered_set<std::string> names_in_use() const;
  // A value name not used by anything in the graph, built from `hint`.
  std::string unique_name(const std::string& hint) const;

  // Structural checks: empty or doubly produced values, inputs that nothing defines, cycles
  // and out-of-order nodes, initializers whose dtype/shape contradict their declared value.
  // Throws Error(InvalidInput) naming the node. `outer_scope` holds values visible to a
  // subgraph from its parents.
  void check(const std::vector<std::string>& outer_scope = {}) const;
  // Reorders nodes topologically (stable); throws InvalidInput naming a node on a cycle.
  void topological_sort();

  uint64_t parameter_count() const;
  uint64_t parameter_bytes() const;

 private:
  std::vector<std::pair<std::string, Tensor>> inits_;
  std::unordered_map<std::string, size_t> init_index_;
  std::vector<QuantRecord> quant_records_;
};

// Fresh names for a pass that adds many values: Graph::unique_name collects every name in use
// on each call, so a pass naming thousands of tensors spent most of its time there (static INT8
// of MiniLM: 0.2 s). This collects them once and takes each name it gives out, so it gives the
// names unique_name would as long as the pass adds names to the graph only through it.
class UniqueNames {
 public:
  explicit UniqueNames(const Graph& graph) : names_(graph.names_in_use()) {}
  // `hint` when free, else hint_1, hint_2, ...: the first that is free. It is then taken.
  std::string take(const std::string& hint);

 private:
  std::unordered_set<std::string> names_;
};

}  // namespace qforge
