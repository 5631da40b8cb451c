#include "exporters/onnx/onnx_exporter.h"

#include <fcntl.h>

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <unistd.h>
#include <onnx/checker.h>
#include <onnx/onnx_pb.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <map>
#include <optional>
#include <span>
#include <vector>

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
  OnnxGraphWriter(OnnxExternalWriter* external, size_t threshold, size_t streamed_threshold)
      : external_(external), threshold_(threshold), streamed_threshold_(streamed_threshold) {}

  // `main`: the model's graph, whose large embedded initializers are left empty in `out` and
  // listed in streamed() (write_model_file writes their bytes).
  void write_graph(const Graph& g, onnx::GraphProto& out, bool main = false);
  const std::map<const onnx::TensorProto*, std::span<const std::byte>>& streamed() const {
    return streamed_;
  }
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
  size_t streamed_threshold_;
  std::vector<onnx::StringStringEntryProto*> locations_;
  std::map<const onnx::TensorProto*, std::span<const std::byte>> streamed_;
};

void OnnxGraphWriter::write_graph(const Graph& g, onnx::GraphProto& out, bool main) {
  for (const auto& node : g.nodes) write_node(node, *out.add_node());
  if (!g.name.empty()) out.set_name(g.name);
  for (const auto& [name, tensor] : g.initializers()) {
    if (tensor.empty()) fail_internal("initializer '" + name + "' has no storage");
    onnx::TensorProto& t = *out.add_initializer();
    t.set_name(name);
    const auto bytes = tensor.bytes();
    if (main && bytes.size() >= streamed_threshold_ && !bytes.empty() &&
        (external_ == nullptr || bytes.size() < threshold_)) {
      for (int64_t d : tensor.shape()) t.add_dims(d);
      t.set_data_type(dtype_to_onnx(tensor.dtype()));
      // One placeholder byte: the checker wants a non-empty value field, not its size.
      t.set_raw_data(std::string(1, '\0'));
      streamed_.emplace(&t, bytes);
      continue;
    }
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

// Writes to a file descriptor in the blocks CopyingOutputStreamAdaptor hands it. Protobuf's own
// FileOutputStream ignores its block size here (libprotobuf 3.21): 8 KiB blocks cost a 90 MB
// model 11,000 write calls.
class FdCopyingStream : public google::protobuf::io::CopyingOutputStream {
 public:
  explicit FdCopyingStream(int fd) : fd_(fd), writeback_(fd) {}
  bool Write(const void* buffer, int size) override {
    const char* p = static_cast<const char*>(buffer);
    while (size > 0) {
      const ssize_t n = ::write(fd_, p, static_cast<size_t>(size));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        errno_ = n < 0 ? errno : EIO;
        return false;
      }
      p += n;
      size -= static_cast<int>(n);
      writeback_.wrote(static_cast<size_t>(n));
    }
    return true;
  }
  int error() const { return errno_; }

 private:
  int fd_;
  WritebackPacer writeback_;
  int errno_ = 0;
};

using google::protobuf::io::CodedOutputStream;

// Protobuf writes a message's fields in field-number order. The model is written in the same
// order here, piece by piece, so that the streamed initializers' bytes go from their storage
// to the file: ModelProto fields 1-6, then its graph (7), then the rest (8 and up); in the
// graph, fields 1-2 (node, name), the initializers (5), then the rest (10 and up); in a
// streamed initializer, its other fields (dims 1, data_type 2, name 8), then raw_data (9). The
// bytes equal those of serializing the whole message with its data in place.
constexpr uint32_t kModelGraphTag = (7 << 3) | 2;
constexpr uint32_t kGraphInitializerTag = (5 << 3) | 2;
constexpr uint32_t kTensorRawDataTag = (9 << 3) | 2;

size_t field_bytes(size_t payload) {
  return 1 + CodedOutputStream::VarintSize64(payload) + payload;  // one-byte tags here
}

struct StreamedModel {
  onnx::ModelProto head, tail;  // fields before and after the graph
  onnx::GraphProto graph_head, graph_tail;
  // Each initializer: its message without the streamed raw_data, and that data (empty when
  // it is in the message).
  std::vector<std::pair<onnx::TensorProto, std::span<const std::byte>>> initializers;
  std::vector<bool> streamed;  // per initializer: its raw_data is written from the span

  size_t tensor_bytes(size_t i) const {
    const auto& [t, data] = initializers[i];
    return t.ByteSizeLong() + (streamed[i] ? field_bytes(data.size()) : 0);
  }
  size_t graph_bytes() const {
    size_t n = graph_head.ByteSizeLong() + graph_tail.ByteSizeLong();
    for (size_t i = 0; i < initializers.size(); ++i) n += field_bytes(tensor_bytes(i));
    return n;
  }
};

// Takes `model` apart (it is left empty); `streamed` lists its initializers whose raw_data is
// to be written from the given bytes.
StreamedModel split_model(onnx::ModelProto& model,
                          const std::map<const onnx::TensorProto*, std::span<const std::byte>>&
                              streamed) {
  StreamedModel m;
  onnx::GraphProto graph;
  graph.Swap(model.mutable_graph());
  model.clear_graph();
  m.head = model;
  m.head.clear_opset_import();
  m.head.clear_metadata_props();
  m.head.clear_training_info();
  m.head.clear_functions();
  m.tail.Swap(&model);
  m.tail.clear_ir_version();
  m.tail.clear_producer_name();
  m.tail.clear_producer_version();
  m.tail.clear_domain();
  m.tail.clear_model_version();
  m.tail.clear_doc_string();
  m.graph_head.mutable_node()->Swap(graph.mutable_node());
  if (graph.has_name()) m.graph_head.set_name(graph.name());
  graph.clear_name();
  for (onnx::TensorProto& t : *graph.mutable_initializer()) {
    const auto it = streamed.find(&t);
    m.streamed.push_back(it != streamed.end());
    m.initializers.emplace_back(onnx::TensorProto(), std::span<const std::byte>());
    m.initializers.back().first.Swap(&t);
    if (it != streamed.end()) {
      m.initializers.back().first.clear_raw_data();
      m.initializers.back().second = it->second;
    }
  }
  graph.clear_initializer();
  m.graph_tail.Swap(&graph);
  return m;
}

bool write_streamed(const StreamedModel& m, CodedOutputStream& out) {
  if (!m.head.SerializeToCodedStream(&out)) return false;
  out.WriteTag(kModelGraphTag);
  out.WriteVarint64(m.graph_bytes());
  if (!m.graph_head.SerializeToCodedStream(&out)) return false;
  for (size_t i = 0; i < m.initializers.size(); ++i) {
    const auto& [t, data] = m.initializers[i];
    out.WriteTag(kGraphInitializerTag);
    out.WriteVarint64(m.tensor_bytes(i));
    if (!t.SerializeToCodedStream(&out)) return false;
    if (m.streamed[i]) {
      out.WriteTag(kTensorRawDataTag);
      out.WriteVarint64(data.size());
      // WriteRaw takes an int: large tensors go in pieces.
      for (size_t at = 0; at < data.size(); at += size_t{1} << 30) {
        const size_t n = std::min(data.size() - at, size_t{1} << 30);
        out.WriteRaw(data.data() + at, static_cast<int>(n));
      }
    }
  }
  if (!m.graph_tail.SerializeToCodedStream(&out)) return false;
  return m.tail.SerializeToCodedStream(&out);
}

void write_model_file(const StreamedModel& model, const AtomicFile& file) {
  const std::string temp = file.temp_path().string();
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail_io("cannot create '" + temp + "': " + std::strerror(errno));
  FdCopyingStream sink(fd);
  bool ok = true;
  {
    google::protobuf::io::CopyingOutputStreamAdaptor stream(&sink, 1 << 20);
    {
      CodedOutputStream coded(&stream);
      coded.SetSerializationDeterministic(true);
      ok = write_streamed(model, coded) && !coded.HadError();
    }
    ok = stream.Flush() && ok;
  }
  ok = ::close(fd) == 0 && ok;
  if (!ok) {
    const int err = sink.error() != 0 ? sink.error() : errno;
    fail_io("cannot write '" + temp + "': " +
            (err != 0 ? std::strerror(err) : "serialization failed") + "; check free disk space");
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
  OnnxGraphWriter writer(data ? &*data : nullptr, options.external_threshold,
                         options.streamed_threshold);
  writer.write_graph(graph, *model.mutable_graph(), true);
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

  size_t streamed_bytes = 0;
  for (const auto& [t, bytes] : writer.streamed()) streamed_bytes += bytes.size();
  const size_t proto_bytes = model.ByteSizeLong() + streamed_bytes;
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
  const StreamedModel streamed = split_model(model, writer.streamed());
  write_model_file(streamed, model_file);
  if (data) data->commit();
  model_file.commit();
}

}  // namespace qforge
