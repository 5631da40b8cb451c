#include "exporters/compressed_tensors/compressed_tensors_writer.h"

#include <cstring>
#include <fstream>
#include <sstream>
#include <unordered_set>

#include <nlohmann/json.hpp>

#include "exporters/atomic_folder.h"
#include "exporters/hf_folder/hf_folder_writer.h"
#include "exporters/safetensors/safetensors_stream_writer.h"
#include "ir/error.h"

namespace qforge {

namespace {

namespace fs = std::filesystem;

constexpr std::string_view kWeightSuffix = ".weight";
// The compressed-tensors release whose loader the interop tests hold this layout to.
constexpr std::string_view kFormatVersion = "0.20.0";

bool is_quantized_linear(const QuantRecord& r) {
  return r.kind == QuantKind::Weight && r.reader.empty() && r.packing == QuantPacking::Onnx &&
         (r.dtype == DType::I4 || r.dtype == DType::I8);
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail_io("cannot read '" + path.string() + "'");
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  if (!out.flush()) fail_io("cannot write '" + path.string() + "'");
}

nlohmann::ordered_json quantization_config(int bits, int64_t block_size,
                                           const std::vector<std::string>& ignore) {
  nlohmann::ordered_json weights = {
      {"num_bits", bits},
      {"type", "int"},
      {"symmetric", true},
      {"strategy", block_size > 0 ? "group" : "channel"},
      {"group_size", block_size > 0 ? nlohmann::ordered_json(block_size) : nullptr},
      {"block_structure", nullptr},
      {"dynamic", false},
      {"actorder", nullptr},
      {"observer", "minmax"},
      {"observer_kwargs", nlohmann::ordered_json::object()},
  };
  nlohmann::ordered_json group = {{"targets", {"Linear"}},
                                  {"weights", std::move(weights)},
                                  {"input_activations", nullptr},
                                  {"output_activations", nullptr},
                                  {"format", "pack-quantized"}};
  return {{"quant_method", "compressed-tensors"},
          {"format", "pack-quantized"},
          {"quantization_status", "compressed"},
          {"config_groups", {{"group_0", std::move(group)}}},
          {"ignore", ignore},
          {"kv_cache_scheme", nullptr},
          {"global_compression_ratio", nullptr},
          {"sparsity_config", nlohmann::ordered_json::object()},
          {"version", kFormatVersion}};
}

}  // namespace

Tensor pack_quantized_int32(const Tensor& values) {
  if ((values.dtype() != DType::I4 && values.dtype() != DType::I8) || values.rank() != 2) {
    fail_internal("pack_quantized_int32: " + std::string(dtype_name(values.dtype())) + " " +
                  shape_to_string(values.shape()) + " is not i4 or i8 [N, K]");
  }
  const int bits = values.dtype() == DType::I4 ? 4 : 8;
  const int64_t n = values.shape()[0], k = values.shape()[1];
  const int64_t words = (k * bits + 31) / 32;
  const int per_word = 32 / bits;
  const uint32_t mask = (1u << bits) - 1;
  const uint32_t offset = 1u << (bits - 1);
  Tensor packed(DType::I32, {n, words});
  auto out = packed.mutable_data<uint32_t>();
  const auto in = values.data<uint8_t>();
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t c = 0; c < k; ++c) {
      const int64_t e = r * k + c;
      int32_t q = 0;
      if (bits == 4) {
        const int nib = (in[static_cast<size_t>(e / 2)] >> (4 * (e % 2))) & 0x0f;
        q = nib >= 8 ? nib - 16 : nib;
      } else {
        q = static_cast<int8_t>(in[static_cast<size_t>(e)]);
      }
      const uint32_t u = (static_cast<uint32_t>(q) + offset) & mask;
      out[static_cast<size_t>(r * words + c / per_word)] |= u << (bits * (c % per_word));
    }
  }
  return packed;
}

CompressedTensorsWriter::CompressedTensorsWriter(const fs::path& out,
                                                 CompressedTensorsOptions options)
    : options_(std::move(options)) {
  if (options_.folder) {
    bool exists = false;
    out_ = check_hf_folder_target(out, options_.overwrite, exists);
    folder_ = std::make_unique<AtomicFolder>(out_, exists, "folder");
    tensors_ = std::make_unique<SafetensorsStreamWriter>(
        folder_->temp_path() / "model.safetensors", options_.max_shard_size,
        std::map<std::string, std::string>{{"format", "pt"}});
  } else {
    out_ = out;
    tensors_ = std::make_unique<SafetensorsStreamWriter>(
        out_, options_.max_shard_size, std::map<std::string, std::string>{{"format", "pt"}});
  }
}

CompressedTensorsWriter::~CompressedTensorsWriter() = default;

uint64_t CompressedTensorsWriter::bytes_written() const { return tensors_->data_bytes(); }

void CompressedTensorsWriter::add(const Graph& part) {
  std::unordered_set<std::string> scales;
  for (const QuantRecord& r : part.quant_records()) {
    if (!is_quantized_linear(r)) {
      fail_unsupported("compressed-tensors holds weights-only quantized Linears; '" + r.name +
                       "' is quantized for a graph node (" +
                       std::string(quant_packing_name(r.packing)) +
                       "): write .onnx or a bundle instead");
    }
    scales.insert(r.scale);
  }
  for (const auto& [name, tensor] : part.initializers()) {
    if (scales.count(name) != 0) continue;  // written beside its weight
    const QuantRecord* r = part.find_quant_record(name);
    if (r == nullptr) {
      tensors_->add(name, tensor);
      continue;
    }
    if (!r->source.ends_with(kWeightSuffix)) {
      fail_invalid("compressed-tensors names a quantized Linear by its module ('<module>.weight'): "
                   "'" + r->source + "' does not end in .weight");
    }
    const Tensor* scale = part.find_initializer(r->scale);
    if (scale == nullptr) {
      fail_internal("quantized Linear '" + name + "' has no scale '" + r->scale + "'");
    }
    schemes_.insert({r->bits, r->block_size});
    if (schemes_.size() > 1) {
      fail_unsupported("compressed-tensors output with Linears of different schemes (bits, "
                       "block size) is not written yet: quantize every Linear the same way");
    }
    const std::string module = r->source.substr(0, r->source.size() - kWeightSuffix.size());
    tensors_->add(module + ".weight_packed", pack_quantized_int32(tensor));
    if (r->block_size > 0) {
      tensors_->add(module + ".weight_scale", *scale);
    } else {  // per channel: [N] -> [N, 1], the same bytes
      tensors_->add(module + ".weight_scale",
                    Tensor(scale->dtype(), {scale->shape()[0], 1}, scale->storage(),
                           scale->offset()));
    }
    Tensor shape(DType::I64, {2});
    shape.mutable_data<int64_t>()[0] = tensor.shape()[0];
    shape.mutable_data<int64_t>()[1] = tensor.shape()[1];
    tensors_->add(module + ".weight_shape", shape);
    ++quantized_;
  }
}

void CompressedTensorsWriter::finish() {
  tensors_->finish();
  if (!options_.folder) return;
  const fs::path& temp = folder_->temp_path();
  for (const std::string& name : list_hf_side_files(options_.source_dir)) {
    const fs::path from = options_.source_dir / name;
    if (name == "config.json" && !schemes_.empty()) {
      nlohmann::ordered_json config;
      try {
        config = nlohmann::ordered_json::parse(read_text(from));
      } catch (const nlohmann::json::parse_error& e) {
        fail_invalid("'" + from.string() + "' is not JSON: " + e.what());
      }
      if (!config.is_object()) fail_invalid("'" + from.string() + "' is not a JSON object");
      const auto [bits, block] = *schemes_.begin();
      config["quantization_config"] = quantization_config(bits, block, options_.ignore);
      write_text(temp / name, config.dump(2) + "\n");
      continue;
    }
    std::error_code ec;
    if (!fs::copy_file(from, temp / name, ec) || ec) {
      fail_io("cannot copy '" + from.string() + "' to '" + (temp / name).string() + "': " +
              ec.message());
    }
  }
  folder_->commit();
}

void write_compressed_tensors(const Graph& weights, const fs::path& out,
                              const CompressedTensorsOptions& options) {
  CompressedTensorsWriter writer(out, options);
  writer.add(weights);
  writer.finish();
}

}  // namespace qforge
