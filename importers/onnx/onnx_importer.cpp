#include "importers/onnx/onnx_importer.h"

#include <unordered_set>

#include "importers/onnx/onnx_parse.h"
#include "importers/onnx/onnx_quant_records.h"
#include "importers/onnx/onnx_tensor.h"
#include "ir/error.h"
#include "ir/mapped_file.h"

namespace qforge {

namespace {

// Converts the protobuf graph (and its subgraphs) into the IR. Tensor data is released from
// the protobuf as it is copied, so the protobuf is taken by non-const reference.
class OnnxGraphReader {
 public:
  explicit OnnxGraphReader(OnnxTensorReader& tensors) : tensors_(tensors) {}

  // `split_initializers`, when given, are the graph's initializers parsed apart (onnx_parse.h).
  Graph read_graph(onnx::GraphProto& proto,
                   std::vector<ParsedInitializer>* split_initializers = nullptr);

 private:
  Node read_node(onnx::NodeProto& proto, const std::string& graph_name);
  Attribute read_attribute(onnx::AttributeProto& proto, const Node& node);
  std::optional<ValueInfo> read_value_info(const onnx::ValueInfoProto& proto,
                                           std::string_view role, const std::string& graph);
  std::shared_ptr<Graph> read_subgraph(onnx::GraphProto& proto) {
    return std::make_shared<Graph>(read_graph(proto));
  }
  const std::string& source() const { return tensors_.source(); }

  OnnxTensorReader& tensors_;
};

std::string_view value_kind(const onnx::TypeProto& type) {
  switch (type.value_case()) {
    case onnx::TypeProto::kSequenceType: return "a sequence";
    case onnx::TypeProto::kMapType: return "a map";
    case onnx::TypeProto::kOptionalType: return "an optional";
    case onnx::TypeProto::kSparseTensorType: return "a sparse tensor";
    default: return "not a tensor";
  }
}

// ONNX models written before IR version 2 may leave AttributeProto.type unset.
onnx::AttributeProto::AttributeType infer_attribute_type(const onnx::AttributeProto& p) {
  using A = onnx::AttributeProto;
  if (p.has_f()) return A::FLOAT;
  if (p.has_i()) return A::INT;
  if (p.has_s()) return A::STRING;
  if (p.has_t()) return A::TENSOR;
  if (p.has_g()) return A::GRAPH;
  if (p.floats_size() > 0) return A::FLOATS;
  if (p.ints_size() > 0) return A::INTS;
  if (p.strings_size() > 0) return A::STRINGS;
  if (p.tensors_size() > 0) return A::TENSORS;
  if (p.graphs_size() > 0) return A::GRAPHS;
  return A::UNDEFINED;
}

}  // namespace

Graph OnnxGraphReader::read_graph(onnx::GraphProto& proto,
                                  std::vector<ParsedInitializer>* split_initializers) {
  Graph g;
  g.name = proto.name();
  g.doc_string = proto.doc_string();
  const std::string graph_label = "graph '" + g.name + "' of '" + source() + "'";
  if (proto.sparse_initializer_size() > 0) {
    fail_unsupported(graph_label + " has sparse initializers (first: '" +
                     proto.sparse_initializer(0).values().name() +
                     "'), which qforge does not support; convert them to dense tensors first");
  }
  auto add_initializer = [&](onnx::TensorProto& init, auto raw_data) {
    if (g.has_initializer(init.name())) {
      fail_invalid("initializer '" + init.name() + "' appears twice in " + graph_label);
    }
    g.set_initializer(init.name(), tensors_.read(init, "tensor '" + init.name() + "'", raw_data));
  };
  for (auto& init : *proto.mutable_initializer()) add_initializer(init, std::nullopt);
  if (split_initializers != nullptr) {
    for (auto& init : *split_initializers) {
      add_initializer(init.proto, init.raw_data);
      init.proto.Clear();
    }
  }
  for (const auto& v : proto.input()) {
    if (auto info = read_value_info(v, "input", g.name)) g.inputs.push_back(std::move(*info));
  }
  for (const auto& v : proto.output()) {
    if (auto info = read_value_info(v, "output", g.name)) g.outputs.push_back(std::move(*info));
  }
  for (const auto& v : proto.value_info()) {
    if (auto info = read_value_info(v, "value_info", g.name)) {
      g.value_info.push_back(std::move(*info));
    }
  }
  g.nodes.reserve(static_cast<size_t>(proto.node_size()));
  for (auto& n : *proto.mutable_node()) g.nodes.push_back(read_node(n, g.name));
  return g;
}

std::optional<ValueInfo> OnnxGraphReader::read_value_info(const onnx::ValueInfoProto& proto,
                                                          std::string_view role,
                                                          const std::string& graph) {
  const std::string what = std::string(role) + " '" + proto.name() + "' of graph '" + graph +
                           "' in '" + source() + "'";
  ValueInfo v;
  v.name = proto.name();
  v.doc_string = proto.doc_string();
  if (!proto.has_type() || proto.type().value_case() == onnx::TypeProto::VALUE_NOT_SET) return v;
  if (proto.type().value_case() != onnx::TypeProto::kTensorType) {
    // value_info only annotates; dropping a non-tensor annotation loses no semantics.
    if (role == "value_info") return std::nullopt;
    fail_unsupported(what + " is " + std::string(value_kind(proto.type())) +
                     ", which qforge does not support; only tensor inputs and outputs are");
  }
  const auto& tensor_type = proto.type().tensor_type();
  v.dtype = dtype_from_onnx_checked(tensor_type.elem_type(), what);
  if (tensor_type.has_shape()) {
    std::vector<Dim> dims;
    dims.reserve(static_cast<size_t>(tensor_type.shape().dim_size()));
    for (const auto& d : tensor_type.shape().dim()) {
      Dim dim;
      if (d.has_dim_value()) dim.value = d.dim_value();
      if (d.has_dim_param()) dim.param = d.dim_param();
      dims.push_back(std::move(dim));
    }
    v.shape = std::move(dims);
  }
  return v;
}

Node OnnxGraphReader::read_node(onnx::NodeProto& proto, const std::string& graph_name) {
  Node n;
  n.name = proto.name();
  n.op_type = proto.op_type();
  n.domain = proto.domain();
  n.inputs.assign(proto.input().begin(), proto.input().end());
  n.outputs.assign(proto.output().begin(), proto.output().end());
  n.doc_string = proto.doc_string();
  n.attributes.reserve(static_cast<size_t>(proto.attribute_size()));
  std::unordered_set<std::string> seen;
  for (auto& a : *proto.mutable_attribute()) {
    if (!seen.insert(a.name()).second) {
      fail_invalid("node " + n.label() + " in graph '" + graph_name + "' of '" + source() +
                   "' has attribute '" + a.name() + "' twice; the file is corrupt");
    }
    n.attributes.push_back(read_attribute(a, n));
  }
  return n;
}

Attribute OnnxGraphReader::read_attribute(onnx::AttributeProto& proto, const Node& node) {
  using A = onnx::AttributeProto;
  const std::string what = "attribute '" + proto.name() + "' of node " + node.label();
  Attribute a;
  a.name = proto.name();
  a.doc_string = proto.doc_string();
  if (!proto.ref_attr_name().empty()) {
    fail_invalid(what + " in '" + source() +
                 "' refers to a function attribute outside a function; the file is corrupt");
  }
  const A::AttributeType type =
      proto.type() == A::UNDEFINED ? infer_attribute_type(proto) : proto.type();
  auto tensor_label = [&](const onnx::TensorProto& t) {
    return t.name().empty() ? what : "tensor '" + t.name() + "' in " + what;
  };
  switch (type) {
    case A::FLOAT: a.type = AttrType::Float; a.f = proto.f(); break;
    case A::INT: a.type = AttrType::Int; a.i = proto.i(); break;
    case A::STRING: a.type = AttrType::String; a.s = proto.s(); break;
    case A::TENSOR:
      a.type = AttrType::Tensor;
      a.t = tensors_.read(*proto.mutable_t(), tensor_label(proto.t()));
      break;
    case A::GRAPH: a.type = AttrType::Graph; a.g = read_subgraph(*proto.mutable_g()); break;
    case A::FLOATS:
      a.type = AttrType::Floats;
      a.floats.assign(proto.floats().begin(), proto.floats().end());
      break;
    case A::INTS:
      a.type = AttrType::Ints;
      a.ints.assign(proto.ints().begin(), proto.ints().end());
      break;
    case A::STRINGS:
      a.type = AttrType::Strings;
      a.strings.assign(proto.strings().begin(), proto.strings().end());
      break;
    case A::TENSORS:
      a.type = AttrType::Tensors;
      for (auto& t : *proto.mutable_tensors()) a.tensors.push_back(tensors_.read(t, tensor_label(t)));
      break;
    case A::GRAPHS:
      a.type = AttrType::Graphs;
      for (auto& sub : *proto.mutable_graphs()) a.graphs.push_back(read_subgraph(sub));
      break;
    case A::SPARSE_TENSOR:
    case A::SPARSE_TENSORS:
    case A::TYPE_PROTO:
    case A::TYPE_PROTOS:
      fail_unsupported(what + " in '" + source() + "' is of type " + A::AttributeType_Name(type) +
                       ", which qforge does not support");
    default:
      fail_invalid(what + " in '" + source() + "' has no or an unknown type (" +
                   std::to_string(static_cast<int>(type)) + "); the file is corrupt");
  }
  return a;
}

namespace {

// `mapped`: `bytes` are a read-only file mapping, whose pages each initializer's data is
// dropped from once copied (ir/page_release.h), so that importing holds about one copy of the
// weights at a time rather than the file's pages and the copies both (MiniLM's 86 MB file:
// peak resident memory 188 -> 104 MiB).
Graph import_bytes(std::span<const std::byte> bytes, const std::filesystem::path& base_dir,
                   std::string_view source_name, bool mapped) {
  const std::string source(source_name);
  ParsedOnnxModel parsed = parse_onnx_model(bytes, source);
  onnx::ModelProto& model = parsed.model;
  if (model.functions_size() > 0) {
    fail_unsupported("'" + source + "' defines " + std::to_string(model.functions_size()) +
                     " local functions (first: '" + model.functions(0).name() +
                     "'), which qforge does not support; inline them first "
                     "(onnx.inliner.inline_local_functions)");
  }
  OnnxTensorReader tensors(base_dir, source, mapped);
  Graph g = OnnxGraphReader(tensors).read_graph(*model.mutable_graph(), &parsed.initializers);
  g.model.ir_version = model.ir_version();
  g.model.producer_name = model.producer_name();
  g.model.producer_version = model.producer_version();
  g.model.domain = model.domain();
  g.model.model_version = model.model_version();
  g.model.doc_string = model.doc_string();
  for (const auto& op : model.opset_import()) {
    if (!g.opset_imports.emplace(op.domain(), op.version()).second) {
      fail_invalid("'" + source + "' imports opset domain '" + op.domain() +
                   "' twice; the file is corrupt");
    }
  }
  for (const auto& kv : model.metadata_props()) g.metadata.emplace_back(kv.key(), kv.value());
  model.Clear();
  for (QuantRecord& r : onnx_quant_records(g)) g.add_quant_record(std::move(r));
  try {
    g.check();
  } catch (const Error& e) {
    fail(e.category(), "'" + source + "': " + e.what());
  }
  return g;
}

}  // namespace

Graph import_onnx_bytes(std::span<const std::byte> bytes, const std::filesystem::path& base_dir,
                        std::string_view source_name) {
  return import_bytes(bytes, base_dir, source_name, false);
}

Graph import_onnx(const std::filesystem::path& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    fail_io("'" + path.string() + "' is a folder; pass the .onnx file inside it");
  }
  const auto file = MappedFile::open(path);
  return import_bytes(file->bytes(), path.parent_path(), path.string(), true);
}

}  // namespace qforge
