#include "cli/quantized_folder_job.h"

#include <algorithm>
#include <chrono>
#include <memory>

#include <spdlog/spdlog.h>

#include "exporters/quant_checkpoint/quant_checkpoint_writer.h"
#include "ir/error.h"
#include "ir/quantized_linear.h"

namespace qforge::cli {

namespace {

constexpr uint64_t kFolderShardSize = 5'000'000'000;  // transformers' default

std::string scheme_text(int bits, int64_t group) {
  return "int" + std::to_string(bits) +
         (group > 0 ? " group " + std::to_string(group) : std::string(" per channel"));
}

std::string checkpoint_text(const QuantizedCheckpoint& q) {
  std::string s;
  for (const QuantizedScheme& x : q.schemes) {
    if (x.linears == 0) continue;
    s += (s.empty() ? "" : " and ") + scheme_text(x.bits, x.group_size);
  }
  return q.quant_method + " " + s;
}

}  // namespace

void warn_no_tokenizer(const std::string& input) {
  spdlog::warn("'{}' is not a Hugging Face model folder (a GGUF file or a TensorRT-LLM "
               "checkpoint): the output's config.json is the one its metadata stands for "
               "(architecture, sizes, heads, RoPE, tie_word_embeddings), and it has no tokenizer "
               "files, generation config or special token ids; copy tokenizer*.json, "
               "special_tokens_map.json and generation_config.json from the original model "
               "folder",
               input);
}

bool keep_checkpoint_scheme(const ConvertOptions& p, QuantScheme scheme, OutputKind out,
                            LoadedModel& loaded) {
  if (!loaded.quantized) {
    if (p.requantize) {
      fail_usage("--requantize is for an already quantized model folder; '" + p.input +
                 "' holds float weights (use --quant alone)");
    }
    return false;
  }
  const QuantizedCheckpoint& q = *loaded.quantized;
  const bool graph_out = out == OutputKind::Onnx || out == OutputKind::Bundle;
  if (scheme == QuantScheme::None) {
    if (p.requantize) fail_usage("--requantize needs --quant (the scheme to quantize to)");
    if (graph_out) return false;  // the decoder graph dequantizes the Linears as it is built
    if (!p.lora.empty() || !p.weights.empty()) {
      fail_usage("--lora and --weights change float weights; '" + p.input + "' is " +
                 checkpoint_text(q) + ": give --quant and --requantize to merge into the "
                 "dequantized weights and quantize again");
    }
    return true;
  }
  std::string why;
  if (graph_out) {
    why = "the graph's weights are the checkpoint's dequantized ones, and --quant " + p.quant +
          " would quantize them again";
  } else if (scheme != QuantScheme::W4A16 && scheme != QuantScheme::Int8Weights) {
    why = "--quant " + p.quant + " does not apply to a model folder's Linear weights";
  } else {
    const int bits = scheme == QuantScheme::W4A16 ? 4 : 8;
    const int64_t group = scheme == QuantScheme::W4A16 ? p.block_size : 0;
    bool same = true;
    for (const QuantizedScheme& s : q.schemes) {
      if (s.linears > 0 && (s.bits != bits || s.group_size != group)) same = false;
    }
    if (same && p.lora.empty() && p.weights.empty() && !p.was_given("--w4-method") &&
        !p.was_given("--w4-scale") && p.calib.data.empty()) {
      if (!p.requantize) return true;  // the scheme asked for is the one stored: re-emit it
    } else if (!p.requantize) {
      why = "--quant " + p.quant + " asks for " + scheme_text(bits, group) +
            (same ? " with options that change the weights" : "");
    }
  }
  if (!why.empty() && !p.requantize) {
    fail_usage("'" + p.input + "' is already quantized (" + checkpoint_text(q) + "); " + why +
               ". Converting keeps the stored integers and scales: drop --quant to re-emit "
               "them, or give --requantize to dequantize and quantize again (adds a second "
               "rounding error)");
  }
  const int64_t n = dequantize_quantized_linears(loaded.graph);
  spdlog::info("--requantize: dequantized the {} quantized Linears of '{}' ({}) to quantize "
               "them again with --quant {}",
               n, p.input, checkpoint_text(q), p.quant);
  loaded.quantized.reset();
  return false;
}

ConvertResult reemit_quantized_checkpoint(const ConvertOptions& p, OutputKind out,
                                          const LoadedModel& loaded) {
  if (out != OutputKind::HfFolder && out != OutputKind::Safetensors) {
    fail_internal("reemit_quantized_checkpoint: the output is not weights-only");
  }
  const QuantizedCheckpoint& q = *loaded.quantized;
  if (!loaded.unfit_linears.empty()) {
    fail_unsupported("'" + p.input + "': " + loaded.unfit_linears.front() + " is asymmetric "
                     "(scale and min per 32), which the symmetric int layouts cannot hold as "
                     "stored (" + std::to_string(loaded.unfit_linears.size()) + " such Linears); "
                     "give --requantize --quant w4a16 --block-size 32 to dequantize and quantize "
                     "again");
  }
  const auto start = std::chrono::steady_clock::now();
  QuantCheckpointOptions wopts;
  wopts.folder = out == OutputKind::HfFolder;
  wopts.config = loaded.config_json;  // a GGUF file's or a TensorRT-LLM checkpoint's
  if (!loaded.config_json) wopts.source_dir = p.input;
  wopts.max_shard_size = p.max_shard_size.value_or(wopts.folder ? kFolderShardSize : 0);
  wopts.overwrite = p.overwrite;
  wopts.ignore = q.ignore;
  // As for a float folder quantized: a causal LM's lm_head is a Linear left float, tied or not.
  if (loaded.hf_config && std::find(wopts.ignore.begin(), wopts.ignore.end(), "lm_head") ==
                              wopts.ignore.end()) {
    wopts.ignore.emplace_back("lm_head");
  }
  wopts.tensor_parallel = p.tensor_parallel;
  wopts.header_reserve = quant_checkpoint_header_bound(loaded.graph);
  // --format picks the layout: the same integers and scales in another engine's layout.
  const std::string format =
      p.format.empty() ? std::string(quant_checkpoint_formats().front()) : p.format;
  if (loaded.config_json && wopts.folder && format != "trtllm-ckpt") warn_no_tokenizer(p.input);
  const std::unique_ptr<QuantCheckpointWriter> writer_ptr =
      make_quant_checkpoint_writer(format, p.output, wopts);
  QuantCheckpointWriter& writer = *writer_ptr;
  writer.add(loaded.graph);
  writer.finish();
  PassReport report;
  report.pass = "reemit-quantized";
  report.stats["from"] = checkpoint_text(q);
  report.stats["to"] = format;
  report.stats["quantized"] = writer.quantized_linears();
  report.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  spdlog::info("{} quantized Linears re-emitted as stored ({}) in the {} layout, nothing "
               "requantized", writer.quantized_linears(), checkpoint_text(q), format);
  ConvertResult result;
  result.weights_bytes_in = loaded.graph.parameter_bytes();
  result.weights_bytes_out = writer.bytes_written();
  result.report.passes.push_back(std::move(report));
  return result;
}

}  // namespace qforge::cli
