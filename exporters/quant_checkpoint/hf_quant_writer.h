#pragma once
// The part of every Hugging Face-shaped quantized checkpoint that does not depend on its layout:
// a model folder (the source folder's config.json with the layout's `quantization_config`, its
// tokenizer and generation files copied unchanged, the weights sharded as save_pretrained shards
// them, built under a temporary name and renamed into place: exporters/atomic_folder.h) or one
// .safetensors file. A layout (HfQuantLayout) says which tensors one quantized Linear becomes and
// what the configuration holds.
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "exporters/quant_checkpoint/quant_checkpoint_writer.h"

namespace qforge {

class AtomicFolder;
class SafetensorsStreamWriter;

// One quantized Linear as the exporters receive it (ir/quantized_linear.h).
struct QuantizedLinearView {
  std::string module;  // "model.layers.0.self_attn.q_proj": the weight's name less ".weight"
  const Tensor& values;  // i4 or i8 [N, K], symmetric
  const Tensor& scale;   // [N, K / block_size], or [N] per channel (block_size 0)
  int bits = 4;
  int64_t block_size = 0;
};

// What was written, for the configuration.
struct HfQuantSummary {
  std::set<std::pair<int, int64_t>> schemes;  // (bits, block size; 0 per channel)
  std::vector<std::string> ignore;            // Linear modules left float
  std::vector<std::string> quantized;         // modules quantized, in the order written
  // The modules of each scheme, in the order written.
  std::map<std::pair<int, int64_t>, std::vector<std::string>> modules;
};

// Receives a layout's tensors.
class TensorSink {
 public:
  virtual ~TensorSink() = default;
  virtual void add(const std::string& name, const Tensor& tensor) = 0;
};

class HfQuantLayout {
 public:
  virtual ~HfQuantLayout() = default;
  virtual std::string_view name() const = 0;  // "compressed-tensors"
  // The tensors one quantized Linear becomes. Throws Unsupported naming the module where the
  // layout cannot hold it (bits, shape, block size).
  virtual void write_linear(const QuantizedLinearView& q, TensorSink& out) const = 0;
  // A float tensor: written as it is unless the layout says otherwise.
  virtual void write_float(const std::string& name, const Tensor& tensor, TensorSink& out) const {
    out.add(name, tensor);
  }
  // Whether one checkpoint may hold Linears of several schemes (bits, block size).
  virtual bool mixed_schemes() const { return false; }
  // config.json's `quantization_config`.
  virtual nlohmann::ordered_json quantization_config(const HfQuantSummary& s) const = 0;
  // Files the layout adds beside config.json (ModelOpt's hf_quant_config.json); none by default.
  virtual void write_side_files(const std::filesystem::path& dir, const HfQuantSummary& s) const {
    (void)dir;
    (void)s;
  }
};

class HfQuantWriter : public QuantCheckpointWriter {
 public:
  HfQuantWriter(std::unique_ptr<HfQuantLayout> layout, const std::filesystem::path& out,
                QuantCheckpointOptions options);
  ~HfQuantWriter() override;
  HfQuantWriter(const HfQuantWriter&) = delete;
  HfQuantWriter& operator=(const HfQuantWriter&) = delete;

  // Throws Unsupported for a record of another form (an ONNX graph's DequantizeLinear weights,
  // MatMulNBits) or, unless the layout allows it, a scheme that differs from an earlier part's;
  // InvalidInput for a quantized tensor whose name does not end in ".weight".
  void add(const Graph& part) override;
  void finish() override;
  uint64_t bytes_written() const override;
  int64_t quantized_linears() const override { return quantized_; }

 private:
  std::unique_ptr<HfQuantLayout> layout_;
  std::filesystem::path out_;
  QuantCheckpointOptions options_;
  std::unique_ptr<AtomicFolder> folder_;
  std::unique_ptr<SafetensorsStreamWriter> tensors_;
  HfQuantSummary summary_;
  int64_t quantized_ = 0;
};

// A config.json (or other JSON file) read whole; InvalidInput naming it when it is not an object.
nlohmann::ordered_json read_json_object(const std::filesystem::path& path);
void write_json(const std::filesystem::path& path, const nlohmann::ordered_json& json);

}  // namespace qforge
