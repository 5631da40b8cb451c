// qforge convert IN -o OUT [--quant ...]: the flags (or a --config job file) fill the driver's
// options (cli/convert_job.h), which does the work; this file prints what it did.
#include <chrono>
#include <cstdio>

#include <spdlog/spdlog.h>

#include "cli/app.h"
#include "cli/budget_job.h"
#include "cli/cmd_calibrate.h"
#include "cli/convert_job.h"
#include "cli/gguf_llama_map.h"
#include "cli/job/job_config.h"
#include "cli/option_parsers.h"
#include "cli/report_job.h"
#include "exporters/quant_checkpoint/quant_checkpoint_writer.h"
#include "ir/dtype.h"
#include "ir/error.h"
#include "ir/json_number.h"
#include "quant/calib/quant_error.h"
#include "quant/schemes.h"

namespace qforge::cli {

namespace {

// The command line's options: the driver's, plus the job file and the command to ask which flags
// were given.
struct ConvertParams : ConvertOptions {
  std::string config;             // --config FILE: options from a job file
  std::string report;             // --report FILE: the HTML report
  const CLI::App* cmd = nullptr;  // to ask which flags were given
};

// One line per tensor: "[i/N] name [shape] f32 -> i8 axis 0  A KiB -> B KiB  SQNR x dB".
void print_tensor_row(size_t i, size_t n, const Json& row) {
  const auto text = [&](const char* key) {
    return row.contains(key)
               ? (row[key].is_string() ? row[key].get<std::string>() : row[key].dump())
               : std::string("?");
  };
  std::string line = "[" + std::to_string(i) + "/" + std::to_string(n) + "] " + text("name") + " " +
                     text("shape") + " " + text("dtype") + " -> " +
                     (row.contains("to") ? text("to") : std::string("i8"));
  if (row.contains("axis")) {
    line += row["axis"].is_number() ? " axis " + row["axis"].dump() : " " + text("axis");
  }
  if (row.contains("bytes_before") && row.contains("bytes_after")) {
    line += "  " + human_bytes(row["bytes_before"].get<uint64_t>()) + " -> " +
            human_bytes(row["bytes_after"].get<uint64_t>());
  }
  if (const auto sqnr = row.contains("sqnr_db") ? json_to_number(row["sqnr_db"]) : std::nullopt) {
    line += "  SQNR " + sqnr_text(*sqnr);
  }
  std::fprintf(stderr, "%s\n", line.c_str());
}

// Other per-row reports (LoRA modules, bound weights): "  key[i/N] k=v k=v ...".
void print_generic_row(const std::string& key, size_t i, size_t n, const Json& row) {
  std::string line = "  " + key + "[" + std::to_string(i) + "/" + std::to_string(n) + "]";
  if (row.is_object()) {
    for (const auto& [k, v] : row.items()) {
      if (v.is_string() && v.get<std::string>().empty()) continue;
      line += " " + k + "=" + (v.is_string() ? v.get<std::string>() : v.dump());
    }
  } else {
    line += " " + (row.is_string() ? row.get<std::string>() : row.dump());
  }
  std::fprintf(stderr, "%s\n", line.c_str());
}

void print_pass_text(const PipelineReport& report) {
  for (const auto& pass : report.passes) {
    char seconds[32];
    std::snprintf(seconds, sizeof seconds, "%.3f s", pass.seconds);
    std::string summary = pass.pass + ": " + seconds;
    for (const auto& [key, value] : pass.stats.items()) {
      // rows stay in --json (the layer-wise pass printed a line per layer as it went)
      if (value.is_array() && (pass.pass == "calibrate" || pass.pass == "layerwise")) continue;
      if (!value.is_array()) {
        summary += ", " + key + " " + (value.is_string() ? value.get<std::string>() : value.dump());
        continue;
      }
      size_t i = 0;
      for (const auto& row : value) {
        ++i;
        if (key == "tensors") {
          print_tensor_row(i, value.size(), row);
        } else {
          print_generic_row(key, i, value.size(), row);
        }
      }
    }
    std::fprintf(stderr, "%s\n", summary.c_str());
    for (const auto& w : pass.warnings) spdlog::warn("{}: {}", pass.pass, w);
  }
}

// --config: the file's options for those not on the command line; IN and -o from either.
void apply_config_file(CLI::App& cmd, const ConvertParams& p) {
  if (!p.config.empty()) {
    const JobSpec job = parse_job_config(read_job_file(p.config), p.config);
    apply_job(bind_job(cmd, job), p.config);
  }
  if (p.input.empty() || p.output.empty()) {
    fail_usage(std::string(p.input.empty() ? "IN (the model to read)" : "-o OUT") +
               " is required: give it on the command line or in --config");
  }
}

int run_convert(const GlobalOptions& global, ConvertParams& p) {
  const auto start = std::chrono::steady_clock::now();
  for (const CLI::Option* opt : p.cmd->get_options()) {
    if (opt->count() == 0) continue;
    for (const auto& name : opt->get_lnames()) p.given.insert("--" + name);
  }
  p.show_progress = !global.quiet;
  check_report_path(p.report, {p.input, p.output, p.config, p.calib.data, p.import_calib, p.eval,
                               p.weights, p.reference});
  p.calib.report_histograms = !p.report.empty();
  ConvertResult result;
  try {
    result = convert_model(p);
  } catch (const BudgetUnreachable& e) {  // its own exit code (README.md, "Exit codes")
    std::fprintf(stderr, "qforge: error: %s\n", e.what());
    if (global.json) {
      print_json({{"ok", false},
                  {"error", e.what()},
                  {"category", "budget unreachable"},
                  {"exit_code", kBudgetUnreachableExit}});
    }
    return kBudgetUnreachableExit;
  }
  const PipelineReport& report = result.report;
  const uint64_t bytes_in = result.weights_bytes_in;
  const DType act_dtype = result.act_dtype;
  const uint64_t bytes_out = result.weights_bytes_out;
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const auto result_json = [&](bool with_timings) {
    return Json{{"ok", true},
                {"command", "convert"},
                {"input", p.input},
                {"output", p.output},
                {"quant", p.quant},
                {"act_dtype", std::string(dtype_name(act_dtype))},
                {"weights_bytes_in", bytes_in},
                {"weights_bytes_out", bytes_out},
                {"passes", report.to_json(with_timings)}};
  };
  if (!p.report.empty()) {
    Json document = result_json(false);
    if (!result.calibration.histograms.empty()) {
      document["histograms"] = calibration_histograms_json(
          result.calibration, p.calib.percentile, resolve_device(parse_device(p.device)));
    }
    write_report(document, p.report, "the conversion of '" + p.input + "'");
  }
  if (global.json) {
    Json out = result_json(true);
    out["seconds"] = seconds;
    if (!p.report.empty()) out["report"] = p.report;
    print_json(out);
  } else if (!global.quiet) {
    print_pass_text(report);
    std::fprintf(stderr, "wrote %s: weights %s -> %s in %.2f s\n", p.output.c_str(),
                 human_bytes(bytes_in).c_str(), human_bytes(bytes_out).c_str(), seconds);
  }
  return 0;
}

}  // namespace

void register_convert(CLI::App& app, const GlobalOptions& global, RunFn& run) {
  auto p = std::make_shared<ConvertParams>();
  auto* cmd = app.add_subcommand("convert", "Import a model, quantize it, write it out");
  // IN and -o are required, from the command line or --config (checked in apply_config_file).
  cmd->add_option("IN", p->input, "Input: ONNX model, safetensors or torch.save checkpoint");
  cmd->add_option("-o,--output", p->output,
                  "Output: .onnx, .safetensors (weights only), an engine bundle folder NAME.qfb, "
                  "or model.gguf with --format gguf");
  cmd->add_option("--config", p->config,
                  "Options from a YAML or JSON file (keys: option names without dashes, input, "
                  "output); flags on the command line override it");
  std::vector<std::string> names;
  for (const auto& info : kQuantSchemes) names.emplace_back(info.name);
  for (const auto& info : kGgufOutTypes) names.emplace_back(info.name);
  std::string quant_help = "Quantization scheme:\n" + quant_schemes_help();
  if (!quant_help.ends_with('\n')) quant_help += '\n';
  cmd->add_option("--quant", p->quant, quant_help + gguf_out_types_help())
      ->check(CLI::IsMember(names));
  std::vector<std::string> formats = {"gguf"};
  std::string layouts;
  for (std::string_view f : quant_checkpoint_formats()) {
    formats.emplace_back(f);
    layouts += (layouts.empty() ? "" : ", ") + std::string(f);
  }
  cmd->add_option("--format", p->format,
                  "Output format when the output's name does not say it: gguf (llama.cpp; IN a "
                  "Hugging Face Llama/Mistral/Qwen2/Qwen3 folder with tokenizer.json, "
                  "-o model.gguf); for a weights-only --quant w4a16|int8-weights of a model "
                  "folder, the layout of the quantized checkpoint: " + layouts +
                  " (default " + std::string(quant_checkpoint_formats().front()) +
                  "; gptq-v2 is GPTQModel's gptq_v2, modelopt-hf ModelOpt's Hugging Face "
                  "export for TensorRT-LLM)")
      ->check(CLI::IsMember(formats));
  cmd->add_flag("--per-tensor", p->per_tensor, "One weight scale per tensor, not per channel");
  cmd->add_option("--exclude", p->exclude, "Leave nodes whose name matches this regex float");
  cmd->add_option("--op-types", p->op_types, "Only quantize these op types (comma-separated)")
      ->delimiter(',');
  add_calib_flags(*cmd, p->calib, false);
  cmd->add_option("--import-calib", p->import_calib,
                  "int8: ranges from a calibration table (JSON or TensorRT cache), not --calib");
  cmd->add_flag("--int32-bias", p->int32_bias,
                "int8: Conv/ConvTranspose/Gemm bias as int32 (scale s_input * s_weight)");
  cmd->add_flag("--concat-shared-scale,!--no-concat-shared-scale", p->concat_shared_scale,
                "int8: one scale for every input and the output of a Concat, the union of their "
                "ranges, so that TensorRT keeps it in INT8 (default on; off leaves Concat float)");
  cmd->add_flag("--add-shared-scale", p->add_shared_scale,
                "int8: one scale for both inputs of a residual Add, the union of their ranges");
  cmd->add_option("--override", p->overrides,
                  "int8: NAME=amax:X (a tensor's range) or NAME=per-tensor (a weight's scale); "
                  "repeatable");
  p->cmd = cmd;
  cmd->add_option("--device", p->device, "Kernel backend: auto, cpu or cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  cmd->add_option("--threads", p->threads, "CPU threads (0 = all cores)")
      ->check(CLI::Range(0, 1024));
  cmd->add_flag("--external-data", p->external_data,
                "Write weights to an external data file beside the model");
  cmd->add_option("--lora", p->lora,
                  "Merge a LoRA adapter (PEFT folder or Kohya file), optionally weighted: "
                  "PATH[:WEIGHT]; repeat to merge several in order")
      ->allow_extra_args(false)
      ->take_all();
  cmd->add_flag("--allow-unmatched", p->allow_unmatched,
                "Warn about adapter or checkpoint tensors that match no weight instead of failing");
  cmd->add_option("--weights", p->weights,
                  "Bind a checkpoint's tensors into the ONNX graph (a fine-tuned state dict into "
                  "an exported architecture)");
  cmd->add_option("--reference", p->reference,
                  "The checkpoint the ONNX graph was exported from, to find anonymous weight "
                  "copies (onnx::MatMul_N) by content");
  cmd->add_option("--seq-len", p->seq_len,
                  "Model folder with --calib token ids: cut each calibration row to this many "
                  "tokens (0 = keep them whole)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--block-size", p->block_size,
                  "w4a16: weights per scale along the reduction axis (32, 64 or 128; on a model "
                  "folder, along each Linear's input dim)")
      ->check(CLI::IsMember({16, 32, 64, 128, 256}));
  cmd->add_option("--int4-format", p->int4_format,
                  "w4a16: onnx-blocked (int4 + blocked DequantizeLinear, opset 21) or "
                  "matmulnbits (com.microsoft.MatMulNBits for ONNX Runtime)")
      ->check(CLI::IsMember({"onnx-blocked", "matmulnbits"}));
  cmd->add_option("--act-dtype", p->act_dtype,
                  "Activation dtype: fp16 (default with --quant w4a16), bf16 or fp32 (default "
                  "otherwise; fp16/bf16 also with --quant none); graph inputs and outputs stay "
                  "fp32, with Casts at the boundary")
      ->check(CLI::IsMember({"fp16", "bf16", "fp32"}));
  cmd->add_option("--keep-fp32", p->keep_fp32,
                  "With fp16/bf16 activations, op types kept in fp32 behind Casts "
                  "(comma-separated; 'default' = LayerNormalization, Softmax, LogSoftmax, "
                  "reductions, Pow, Sqrt, Exp, output-projection, embeddings; 'none')");
  cmd->add_option("--w4-method", p->w4_method,
                  "w4a16: rtn (round to nearest with a per-block scale search), awq "
                  "(activation-aware scales searched on --calib DATA, then round to nearest) or "
                  "gptq (rows quantized in order, each one's rounding error compensated by the "
                  "rows after it, weighted by --calib DATA's X^T X)")
      ->check(CLI::IsMember({"rtn", "awq", "gptq"}));
  cmd->add_option("--w4-scale", p->w4_scale,
                  "w4a16 int4 block scale: mse (default with rtn and gptq: the scale with the "
                  "least block error among +-amax/7 x {1.00, 0.98, ..., 0.80} and +-amax/8, "
                  "then refined by least squares) or amax (scale = amax/7; default with awq, "
                  "whose clip search chooses the clip, and on a model folder the block scale "
                  "among 0.55-1 x amax/7 and the signed amax/8)")
      ->check(CLI::IsMember({"mse", "amax"}));
  cmd->add_option("--w4-include", p->w4_include,
                  "w4a16: also quantize what stays float by default (comma-separated): "
                  "embeddings (Gather tables, blocks along the hidden axis), output-projection "
                  "(the MatMul/Gemm whose result is a graph output, and names matching lm_head)")
      ->delimiter(',')
      ->check(CLI::IsMember({"embeddings", "output-projection"}));
  cmd->add_option("--tp", p->tensor_parallel,
                  "--format trtllm-ckpt: tensor-parallel ranks, written as rank0..rank{N-1}"
                  ".safetensors split as TensorRT-LLM's converter splits them (default 1)")
      ->check(CLI::Range(1, 1024));
  cmd->add_option("--precision", p->precision,
                  "Model folder, --quant w4a16|int8-weights: REGEX=int4|int8|float gives the "
                  "Linear modules whose name matches REGEX (e.g. 'mlp\\.down_proj$') that "
                  "precision instead of --quant's; int4 in blocks of --block-size; repeatable, "
                  "first match wins (compressed-tensors writes one config group per scheme)");
  cmd->add_option("--target-cosine", p->target_cosine,
                  "w4a16/int8 accuracy budget: keep the most sensitive layers at higher "
                  "precision (w4a16: int4 -> int8 per channel -> float; int8: -> float) until "
                  "the output cosine to the float model on --eval reaches this; exit 7, writing "
                  "nothing, when even the top of the ladder misses it. On a model folder "
                  "(w4a16 or int8-weights, round to nearest): the decoder's logits on token ids, "
                  "the checkpoint written with the chosen per-module precisions");
  cmd->add_option("--target-sqnr", p->target_sqnr,
                  "Accuracy budget as --target-cosine, on the output SQNR (dB)");
  cmd->add_option("--max-drop", p->max_drop,
                  "Accuracy budget as --target-cosine, on the top-1 accuracy drop (points) "
                  "against --eval's integer `labels`");
  cmd->add_option("--eval", p->eval,
                  "The accuracy budget's evaluation data (default: the last fifth of --calib, "
                  "then left out of calibration; w4a16 rtn: all of --calib)");
  cmd->add_option("--eval-pool", p->eval_pool,
                  "How the accuracy budget compares outputs: none (every real token's values "
                  "together, as `qforge compare`; default) or mean (a sentence embedding per "
                  "sample: [batch, seq, ...] outputs averaged over the real tokens of "
                  "--calib-mask, the cosine averaged over samples; for mean-pooling embedding "
                  "models such as MiniLM)")
      ->check(CLI::IsMember({"none", "mean"}));
  cmd->add_option("--report", p->report,
                  "Also write an HTML report (self-contained, inline SVG): per-tensor weight "
                  "error, int8 calibration histograms with every method's threshold, the "
                  "accuracy budget's sensitivity ranking and search");
  cmd->add_flag("--overwrite", p->overwrite, "Replace an existing .qfb bundle or model folder");
  cmd->add_flag("--requantize", p->requantize,
                "An already quantized folder (compressed-tensors) to another --quant scheme: "
                "dequantize its Linears and quantize again (without it, such a request is "
                "refused; with no --quant the stored integers and scales are re-emitted)");
  cmd->add_option("--max-shard-size", p->max_shard_size,
                  "Split a .safetensors or model folder output into shards of at most this "
                  "size (bytes, or 500MB, 2GB, 1GiB...), with a model.safetensors.index.json; "
                  "0 = one file. Default: one file for .safetensors, 5GB for a folder")
      ->transform(CLI::AsSizeValue(/*kb_is_1000=*/true));
  cmd->footer(
      "Examples:\n  qforge convert calib_data/sample_cnn.onnx -o sample_int8w.onnx "
      "--quant int8-weights\n  qforge convert calib_data/sample_cnn.onnx -o sample_int8.onnx "
      "--quant int8 --calib calib_data/calib.npz --method entropy\n  qforge convert "
      "calib_data/sample_cnn.onnx -o sample.qfb --quant int8 --calib calib_data/calib.npz\n  "
      "qforge convert Llama-3.2-1B/ -o llama_copy/ --max-shard-size 2GB\n  qforge convert "
      "Llama-3.2-1B/ -o llama_w4/ --quant w4a16 --block-size 128   (a model folder's Linear "
      "weights, compressed-tensors pack-quantized; int8-weights: per channel)\n  qforge convert "
      "model.onnx -o model_w4.onnx --quant w4a16 --block-size 128\n  qforge "
      "convert model.onnx -o model_awq.onnx --quant w4a16 --w4-method awq --calib calib.npz\n  "
      "qforge convert model.onnx -o model_fp16.onnx --act-dtype fp16 --keep-fp32 default,Gelu\n  "
      "qforge convert Llama-3.2-1B/ --format gguf --quant q8_0 -o llama-q8_0.gguf\n  "
      "qforge convert llama_w4/ -o llama_w4_copy/   (a compressed-tensors folder re-emitted "
      "as stored; -o model.onnx builds its decoder graph with the Linears dequantized)\n  "
      "qforge convert Llama-3.2-1B/ --quant w4a16 --format gptq -o llama-gptq/   (also gptq-v2, "
      "awq, modelopt-hf)\n  qforge "
      "convert Llama-3.2-1B/ --quant w4a16 --format trtllm-ckpt --tp 2 -o llama_trt/   "
      "(then trtllm-build --checkpoint_dir llama_trt/)\n  qforge "
      "convert minilm.onnx -o minilm_w4.onnx --quant w4a16 --target-cosine 0.98 --calib "
      "sentences.npz   (mixed precision to a budget)\n  qforge convert calib_data/sample_cnn.onnx "
      "-o cnn_int8.onnx --quant int8 --calib calib_data/calib.npz --report cnn_int8.html");
  cmd->callback([&global, &run, p, cmd] {
    run = [&global, p, cmd] {
      apply_config_file(*cmd, *p);
      return run_convert(global, *p);
    };
  });
}

}  // namespace qforge::cli
