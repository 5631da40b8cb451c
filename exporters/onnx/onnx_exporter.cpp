#include "exporters/onnx/onnx_exporter.h"

#include <fcntl.h>

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl.h>
#include <onnx/checker.h>
#include <onnx/onnx_pb.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <optional>

#include "exporters/atomic_file.h"
#include "exporters/onnx/onnx_external_writer.h"
#include "ir/error.h"

namespace qforge {

namespace {

// The newest IR version and default-domain opset that Debian's ONNX 1.12 checker knows.
constexpr int64_t kCheckerMaxIrVersion = 8;
constexpr int64_t kCheckerMaxOpset = 17;

uint64_t tensor_bytes(const Graph& g) {
  uint64_t total = g.parameter_bytes();
  for (const auto& node : g.nodes) {
    for (const auto& a : node.attributes) {
      total += a.t.nbytes();
      for (const auto& t : a.tensors) total += t.nbytes();
      if (a.g) total += tensor_bytes(*a.g);
      for (const auto& sub : a.graphs) total += tensor_bytes(*sub);
    }
  }
  return total;
}

// Writes IR graphs into protobuf; initializers of at least `threshold` bytes go to `external`
// when it is set. The location of each external tensor is recorded so that it can point at
// the temporary data file while the checker runs and at the final name when written.
class OnnxGraphWriter {
 public:
  OnnxGraphWriter(OnnxExternalWriter* external, size_t threshold)
      : external_(external), threshold_(threshold) {}

  void write_graph(const Graph& g, onnx::GraphProto& out);
  bool has_external() const { return !locations_.empty(); }
  void set_locations(const std::string& location) {
    for (auto* entry : locations_) entry->set_value(location);
  }

 private:
  void write_node(const Node& node, onnx::NodeProto& out);
  void write_attribute(const Attribute& a, const Node& node, onnx::AttributeProto& out);
  void write_tensor(const Tensor& t, onnx::TensorProto& out, bool may_go_external);
  static void write_value_info(const ValueInfo& v, onnx::ValueInfoProto& out);

  OnnxExternalWriter* external_;
  size_t threshold_;
  std::vector<onnx::StringStringEntryProto*> locations_;
};

void OnnxGraphWriter::write_graph(const Graph& g, onnx::GraphProto& out) {
  for (const auto& node : g.nodes) write_node(node, *out.add_node());
  if (!g.name.empty()) out.set_name(g.name);
  for (const auto& [name, tensor] : g.initializers()) {
    if (tensor.empty()) fail_internal("initializer '" + name + "' has no storage");
    onnx::TensorProto& t = *out.add_initializer();
    t.set_name(name);
    write_tensor(tensor, t, true);
  }
  if (!g.doc_string.empty()) out.set_doc_string(g.doc_string);
  for (const auto& v : g.inputs) write_value_info(v, *out.add_input());
  for (const auto& v : g.outputs) write_value_info(v, *out.add_output());
  for (const auto& v : g.value_info) write_value_info(v, *out.add_value_info());
}

void OnnxGraphWriter::write_node(const Node& node, onnx::NodeProto& out) {
  for (const auto& in : node.inputs) out.add_input(in);
  for (const auto& o : node.outputs) out.add_output(o);
  if (!node.name.empty()) out.set_name(node.name);
  out.set_op_type(node.op_type);
  for (const auto& a : node.attributes) write_attribute(a, node, *out.add_attribute());
  if (!node.doc_string.empty()) out.set_doc_string(node.doc_string);
  if (!node.domain.empty()) out.set_domain(node.domain);
}

void OnnxGraphWriter::write_attribute(const Attribute& a, const Node& node,
                                      onnx::AttributeProto& out) {
  using A = onnx::AttributeProto;
  out.set_name(a.name);
  if (!a.doc_string.empty()) out.set_doc_string(a.doc_string);
  auto require_graph = [&](const std::shared_ptr<Graph>& g) -> const Graph& {
    if (!g) fail_internal("attribute '" + a.name + "' of node " + node.label() + " has no graph");
    return *g;
  };
  switch (a.type) {
    case AttrType::Float: out.set_type(A::FLOAT); out.set_f(a.f); break;
    case AttrType::Int: out.set_type(A::INT); out.set_i(a.i); break;
    case AttrType::String: out.set_type(A::STRING); out.set_s(a.s); break;
    case AttrType::Tensor:
      out.set_type(A::TENSOR);
      if (a.t.empty()) {
        fail_internal("attribute '" + a.name + "' of node " + node.label() + " has no tensor");
      }
      write_tensor(a.t, *out.mutable_t(), false);
      break;
    case AttrType::Graph:
      out.set_type(A::GRAPH);
      write_graph(require_graph(a.g), *out.mutable_g());
      break;
    case AttrType::Floats:
      out.set_type(A::FLOATS);
      out.mutable_floats()->Add(a.floats.begin(), a.floats.end());
      break;
    case AttrType::Ints:
      out.set_type(A::INTS);
      out.mutable_ints()->Add(a.ints.begin(), a.ints.end());
      break;
    case AttrType::Strings:
      out.set_type(A::STRINGS);
      for (const auto& s : a.strings) out.add_strings(s);
      break;
    case AttrType::Tensors:
      out.set_type(A::TENSORS);
      for (const auto& t : a.tensors) write_tensor(t, *out.add_tensors(), false);
      break;
    case AttrType::Graphs:
      out.set_type(A::GRAPHS);
      for (const auto& g : a.graphs) write_graph(require_graph(g), *out.add_graphs());
      break;
  }
}

void OnnxGraphWriter::write_tensor(const Tensor& t, onnx::TensorProto& out, bool may_go_external) {
  for (int64_t d : t.shape()) out.add_dims(d);
  out.set_data_type(dtype_to_onnx(t.dtype()));
  const auto bytes = t.bytes();
  if (external_ == nullptr || !may_go_external || bytes.size() < threshold_ || bytes.empty()) {
    out.set_raw_data(bytes.data(), bytes.size());
    return;
  }
  const uint64_t offset = external_->append(bytes);
  auto* location = out.add_external_data();
  location->set_key("location");
  locations_.push_back(location);
  auto* off = out.add_external_data();
  off->set_key("offset");
  off->set_value(std::to_string(offset));
  auto* len = out.add_external_data();
  len->set_key("length");
  len->set_value(std::to_string(bytes.size()));
  out.set_data_location(onnx::TensorProto::EXTERNAL);
}

void OnnxGraphWriter::write_value_info(const ValueInfo& v, onnx::ValueInfoProto& out) {
  out.set_name(v.name);
  if (!v.doc_string.empty()) out.set_doc_string(v.doc_string);
  if (!v.dtype && !v.shape) return;
  auto& tensor_type = *out.mutable_type()->mutable_tensor_type();
  if (v.dtype) tensor_type.set_elem_type(dtype_to_onnx(*v.dtype));
  if (v.shape) {
    auto& shape = *tensor_type.mutable_shape();
    for (const Dim& d : *v.shape) {
      auto& dim = *shape.add_dim();
      if (d.value) dim.set_dim_value(*d.value);
      if (!d.param.empty()) dim.set_dim_param(d.param);
    }
  }
}

std::string one_line(std::string s) {
  for (char& c : s) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s;
}

void write_model_file(const onnx::ModelProto& model, const AtomicFile& file) {
  const std::string temp = file.temp_path().string();
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail_io("cannot create '" + temp + "': " + std::strerror(errno));
  google::protobuf::io::FileOutputStream stream(fd);
  bool ok = true;
  {
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    ok = model.SerializeToCodedStream(&coded) && !coded.HadError();
  }
  ok = stream.Close() && ok;
  if (!ok) {
    const int err = stream.GetErrno();
    fail_io("cannot write '" + temp + "': " + (err != 0 ? std::strerror(err) : "serialization failed") +
            "; check free disk space");
  }
}

}  // namespace

void export_onnx(const Graph& graph, const std::filesystem::path& path,
                 const OnnxExportOptions& options) {
  try {
    graph.check();
    graph.check_quant_records();
  } catch (const Error& e) {
    fail(e.category(), "cannot export '" + path.string() + "': " + e.what());
  }
  const std::string data_name = options.external_data_name.empty()
                                    ? path.filename().string() + ".data"
                                    : options.external_data_name;
  const std::filesystem::path data_rel(data_name);
  if (data_name == "." || data_name == ".." || data_rel.has_parent_path() ||
      data_rel.filename() != data_rel || data_name == path.filename().string()) {
    fail_usage("external data name '" + data_name +
               "' must be a plain file name beside the model, different from the model's");
  }

  AtomicFile model_file(path);  // checks the folder before any work
  const bool external = options.external_data || tensor_bytes(graph) > options.auto_external_bytes;
  std::optional<OnnxExternalWriter> data;
  if (external) data.emplace(path.parent_path() / data_rel);

  onnx::ModelProto model;
  model.set_ir_version(graph.model.ir_version);
  if (!graph.model.producer_name.empty()) model.set_producer_name(graph.model.producer_name);
  if (!graph.model.producer_version.empty()) {
    model.set_producer_version(graph.model.producer_version);
  }
  if (!graph.model.domain.empty()) model.set_domain(graph.model.domain);
  if (graph.model.model_version != 0) model.set_model_version(graph.model.model_version);
  if (!graph.model.doc_string.empty()) model.set_doc_string(graph.model.doc_string);
  OnnxGraphWriter writer(data ? &*data : nullptr, options.external_threshold);
  writer.write_graph(graph, *model.mutable_graph());
  for (const auto& [domain, version] : graph.opset_imports) {
    auto* op = model.add_opset_import();
    op->set_domain(domain);
    op->set_version(version);
  }
  for (const auto& [key, value] : graph.metadata) {
    auto* kv = model.add_metadata_props();
    kv->set_key(key);
    kv->set_value(value);
  }
  if (data && !writer.has_external()) data.reset();  // nothing reached the threshold
  if (data) data->close();

  const size_t proto_bytes = model.ByteSizeLong();
  if (proto_bytes > static_cast<size_t>(INT_MAX)) {
    fail_unsupported("model for '" + path.string() + "' would be " +
                     std::to_string(proto_bytes) + " bytes, over protobuf's 2 GiB limit" +
                     (data ? " even with its initializers external (large Constant nodes?); "
                             "turn large constants into initializers"
                           : "; export it with external data"));
  }
  if (options.run_checker && graph.opset("") <= kCheckerMaxOpset &&
      graph.model.ir_version <= kCheckerMaxIrVersion) {
    // The checker looks for external data relative to the working folder: show it the
    // temporary data file by absolute path, then write the final relative name.
    if (data) writer.set_locations(std::filesystem::absolute(data->temp_path()).string());
    try {
      onnx::checker::check_model(model);
    } catch (const std::exception& e) {
      fail_invalid("ONNX checker rejects the model to be written to '" + path.string() +
                   "': " + one_line(e.what()) + "; fix the input model or disable the checker");
    }
  }
  if (data) writer.set_locations(data_name);
  write_model_file(model, model_file);
  if (data) data->commit();
  model_file.commit();
}

}  // namespace qforge
