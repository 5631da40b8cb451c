#pragma once
// `qforge convert` as one library call: ConvertOptions (what the flags and a --config file say)
// in, the model read, the passes the options ask for run, the output written, and what was done
// returned. cmd_convert.cpp fills the options from the command line and prints the result;
// nothing here parses flags or prints.
#include <cstdint>
#include <set>
#include <optional>
#include <string>
#include <vector>

#include "cli/calib_flags.h"
#include "ir/calibration_table.h"
#include "ir/dtype.h"
#include "ir/pass.h"

namespace qforge::cli {

struct ConvertOptions {
  std::string input;
  std::string output;
  std::string quant = "none";
  std::string format;  // "" (from the output's name) or "gguf"
  bool per_tensor = false;
  std::string exclude;
  std::vector<std::string> op_types;
  std::string device = "auto";
  int threads = 0;
  bool external_data = false;
  std::optional<uint64_t> max_shard_size;  // unset: one .safetensors file, 5 GB folder shards
  std::vector<std::string> lora;  // PATH[:WEIGHT], applied in order
  bool allow_unmatched = false;
  std::string weights;    // a checkpoint whose tensors replace the graph's weights
  std::string reference;  // the checkpoint the graph was exported from, for content matching
  // --quant int8
  CalibFlags calib;
  int64_t seq_len = 0;  // token-id calibration data (a model folder): cut rows to this length
  std::string import_calib;
  bool int32_bias = false;
  std::vector<std::string> overrides;
  bool concat_shared_scale = true;  // one scale for a Concat's inputs and output
  bool add_shared_scale = false;    // one scale for a residual Add's two inputs
  // --quant w4a16
  int block_size = 128;
  std::string int4_format = "onnx-blocked";
  // activations: "" = the scheme's default (fp16 for w4a16, else fp32)
  std::string act_dtype;
  std::string keep_fp32;          // "" = default_keep_fp32_ops()
  std::string w4_method = "rtn";  // rtn, awq or gptq (awq and gptq calibrate on --calib)
  std::string w4_scale;           // mse or amax; "" = the method's default
  // Left float by default, quantized when named: "embeddings" (Gather tables),
  // "output-projection" (the MatMul/Gemm producing a graph output, and names matching lm_head).
  std::vector<std::string> w4_include;
  // Accuracy budget (cli/budget_job.h): per-layer precision chosen to meet these on --eval DATA
  // (default: a held-out part of --calib).
  std::optional<double> target_cosine;
  std::optional<double> target_sqnr;
  std::optional<double> max_drop;
  std::string eval;
  std::string eval_pool = "none";  // none or mean (BudgetPool)
  bool overwrite = false;  // .qfb output: replace an existing bundle
  // A quantized model folder (compressed-tensors) converted to another scheme: dequantize and
  // quantize again instead of refusing (cli/quantized_folder_job.h).
  bool requantize = false;
  int tensor_parallel = 1;  // --tp: ranks of a --format trtllm-ckpt checkpoint
  // --precision REGEX=int4|int8|float, in order (cli/precision_flags.h): a model folder's
  // weight-only quantization in mixed precision.
  std::vector<std::string> precision;
  // The flags given explicitly ("--w4-method", ...): some are refused with some schemes even
  // at their default value.
  std::set<std::string> given;
  bool show_progress = false;  // progress bars on stderr (calibration)

  bool was_given(const std::string& flag) const { return given.count(flag) > 0; }
};

struct ConvertResult {
  PipelineReport report;  // every pass run, in order
  DType act_dtype = DType::F32;
  uint64_t weights_bytes_in = 0;
  uint64_t weights_bytes_out = 0;
  // --quant int8: the ranges used, with calibration's histograms (for --report).
  CalibrationTable calibration;
};

// Checks every option, then reads, converts and writes. Bad options throw Usage before any file
// is read; the output is written atomically or not at all.
ConvertResult convert_model(const ConvertOptions& options);

}  // namespace qforge::cli
