#include "exporters/quant_checkpoint/hf_quant_writer.h"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <unordered_set>

#include "exporters/atomic_folder.h"
#include "exporters/hf_folder/hf_folder_writer.h"
#include "exporters/safetensors/safetensors_stream_writer.h"
#include "ir/error.h"

namespace qforge {

namespace {

namespace fs = std::filesystem;

constexpr std::string_view kWeightSuffix = ".weight";

bool is_quantized_linear(const QuantRecord& r) {
  return r.kind == QuantKind::Weight && r.reader.empty() && r.packing == QuantPacking::Onnx &&
         (r.dtype == DType::I4 || r.dtype == DType::I8);
}

class StreamSink : public TensorSink {
 public:
  explicit StreamSink(SafetensorsStreamWriter& out) : out_(out) {}
  void add(const std::string& name, const Tensor& tensor) override { out_.add(name, tensor); }

 private:
  SafetensorsStreamWriter& out_;
};

}  // namespace

nlohmann::ordered_json read_json_object(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail_io("cannot read '" + path.string() + "'");
  std::ostringstream text;
  text << in.rdbuf();
  nlohmann::ordered_json json;
  try {
    json = nlohmann::ordered_json::parse(text.str());
  } catch (const nlohmann::json::parse_error& e) {
    fail_invalid("'" + path.string() + "' is not JSON: " + e.what());
  }
  if (!json.is_object()) fail_invalid("'" + path.string() + "' is not a JSON object");
  return json;
}

void write_json(const fs::path& path, const nlohmann::ordered_json& json) {
  std::ofstream out(path, std::ios::binary);
  out << json.dump(2) << "\n";
  if (!out.flush()) fail_io("cannot write '" + path.string() + "'");
}

HfQuantWriter::HfQuantWriter(std::unique_ptr<HfQuantLayout> layout, const fs::path& out,
                             QuantCheckpointOptions options)
    : layout_(std::move(layout)), options_(std::move(options)) {
  summary_.ignore = options_.ignore;
  const std::map<std::string, std::string> metadata{{"format", "pt"}};
  if (options_.folder) {
    bool exists = false;
    out_ = check_hf_folder_target(out, options_.overwrite, exists);
    folder_ = std::make_unique<AtomicFolder>(out_, exists, "folder");
    tensors_ = std::make_unique<SafetensorsStreamWriter>(
        folder_->temp_path() / "model.safetensors", options_.max_shard_size, metadata,
        options_.header_reserve);
  } else {
    out_ = out;
    tensors_ =
        std::make_unique<SafetensorsStreamWriter>(out_, options_.max_shard_size, metadata,
                                                  options_.header_reserve);
  }
}

HfQuantWriter::~HfQuantWriter() = default;

uint64_t HfQuantWriter::bytes_written() const { return tensors_->data_bytes(); }

void HfQuantWriter::add(const Graph& part) {
  const std::string layout(layout_->name());
  std::unordered_set<std::string> scales;
  for (const QuantRecord& r : part.quant_records()) {
    if (!is_quantized_linear(r)) {
      fail_unsupported(layout + " holds weights-only quantized Linears; '" + r.name +
                       "' is quantized for a graph node (" +
                       std::string(quant_packing_name(r.packing)) +
                       "): write .onnx or a bundle instead");
    }
    scales.insert(r.scale);
  }
  StreamSink sink(*tensors_);
  for (const auto& [name, tensor] : part.initializers()) {
    if (scales.count(name) != 0) continue;  // written beside its weight
    const QuantRecord* r = part.find_quant_record(name);
    if (r == nullptr) {
      layout_->write_float(name, tensor, sink);
      continue;
    }
    if (!r->source.ends_with(kWeightSuffix)) {
      fail_invalid(layout + " names a quantized Linear by its module ('<module>.weight'): '" +
                   r->source + "' does not end in .weight");
    }
    const Tensor* scale = part.find_initializer(r->scale);
    if (scale == nullptr) {
      fail_internal("quantized Linear '" + name + "' has no scale '" + r->scale + "'");
    }
    const std::string module = r->source.substr(0, r->source.size() - kWeightSuffix.size());
    const std::pair<int, int64_t> scheme{r->bits, r->block_size};
    if (!summary_.schemes.empty() && summary_.schemes.count(scheme) == 0 &&
        !layout_->mixed_schemes()) {
      const auto [bits, block] = *summary_.schemes.begin();
      fail_unsupported(layout + " holds one scheme per checkpoint, and '" + module + "' is " +
                       quant_scheme_text(r->bits, r->block_size) + " where '" +
                       summary_.modules.at(*summary_.schemes.begin()).front() + "' is " +
                       quant_scheme_text(bits, block) +
                       ": write --format compressed-tensors (one config group per scheme), "
                       "or quantize every Linear the same way");
    }
    summary_.schemes.insert(scheme);
    summary_.modules[scheme].push_back(module);
    layout_->write_linear({module, tensor, *scale, r->bits, r->block_size}, sink);
    summary_.quantized.push_back(module);
    ++quantized_;
  }
}

void HfQuantWriter::finish() {
  tensors_->finish();
  if (!options_.folder) return;
  const fs::path& temp = folder_->temp_path();
  if (options_.config) {
    nlohmann::ordered_json config = *options_.config;
    if (!summary_.schemes.empty()) {
      config["quantization_config"] = layout_->quantization_config(summary_);
    }
    write_json(temp / "config.json", config);
  }
  for (const std::string& name : list_hf_side_files(options_.source_dir)) {
    const fs::path from = options_.source_dir / name;
    if (name == "config.json" && options_.config) continue;
    if (name == "config.json" && !summary_.schemes.empty()) {
      nlohmann::ordered_json config = read_json_object(from);
      config["quantization_config"] = layout_->quantization_config(summary_);
      write_json(temp / name, config);
      continue;
    }
    std::error_code ec;
    if (!fs::copy_file(from, temp / name, ec) || ec) {
      fail_io("cannot copy '" + from.string() + "' to '" + (temp / name).string() + "': " +
              ec.message());
    }
  }
  if (!summary_.schemes.empty()) layout_->write_side_files(temp, summary_);
  folder_->commit();
}

}  // namespace qforge
