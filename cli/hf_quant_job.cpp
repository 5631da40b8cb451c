#include "cli/hf_quant_job.h"

#include <algorithm>
#include <chrono>
#include <future>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include <spdlog/spdlog.h>

#include "cli/hf_layerwise_job.h"
#include "cli/option_parsers.h"
#include "cli/precision_flags.h"
#include "cli/quantized_folder_job.h"
#include "exporters/quant_checkpoint/quant_checkpoint_writer.h"
#include "exporters/trtllm/trtllm_ckpt_writer.h"
#include "ir/error.h"
#include "ir/page_release.h"
#include "ir/weight_inventory.h"
#include "quant/calib/quant_error.h"
#include "quant/weights/linear_weight_quant.h"

namespace qforge::cli {

namespace {

constexpr uint64_t kFolderShardSize = 5'000'000'000;  // transformers' default
constexpr std::string_view kWeightSuffix = ".weight";

// Flags of the graph schemes that mean nothing for a checkpoint's Linear weights.
void check_flags(const ConvertOptions& p, QuantScheme scheme, bool layerwise) {
  const std::string quant = "--quant " + std::string(quant_scheme_name(scheme));
  const auto refuse = [&](const std::string& flag, const std::string& why) {
    fail_usage(flag + " " + why + "; with " + quant + " on the weights-only '" + p.input +
               "' the decoder's Linear weights are quantized round-to-nearest");
  };
  if (parse_w4_method(p.w4_method) != W4Method::Rtn && !layerwise) {
    refuse("--w4-method " + p.w4_method,
           "calibrates layer by layer on a model folder's decoder (give the folder and --calib)");
  }
  if (p.was_given("--int4-format")) refuse("--int4-format", "picks an ONNX form");
  if (!p.exclude.empty() || !p.op_types.empty() || p.per_tensor || !p.w4_include.empty()) {
    refuse("--exclude, --op-types, --per-tensor and --w4-include",
           "select graph nodes (the rule table picks the Linear weights)");
  }
  if (!p.act_dtype.empty() || !p.keep_fp32.empty()) {
    refuse("--act-dtype and --keep-fp32", "convert a graph's activations");
  }
  if (!p.weights.empty()) refuse("--weights", "binds a checkpoint to a graph's nodes");
  if (scheme == QuantScheme::W4A16 && p.block_size != 32 && p.block_size != 64 &&
      p.block_size != 128) {
    fail_usage("--block-size " + std::to_string(p.block_size) +
               ": compressed-tensors W4A16 takes 32, 64 or 128 (the group sizes vLLM's "
               "kernels run)");
  }
}

std::string module_of(const std::string& weight) {
  return weight.ends_with(kWeightSuffix) ? weight.substr(0, weight.size() - kWeightSuffix.size())
                                         : weight;
}

}  // namespace

LinearWeightQuantOptions folder_linear_options(const ConvertOptions& p, QuantScheme scheme) {
  LinearWeightQuantOptions opts;
  opts.bits = scheme == QuantScheme::W4A16 ? 4 : 8;
  opts.block_size = p.block_size;
  opts.int4_scale = p.w4_scale.empty() ? default_int4_scale(W4Method::Rtn)
                                       : parse_int4_scale(p.w4_scale);
  opts.device = resolve_device(parse_device(p.device));
  opts.fp16_scales = quant_checkpoint_stores_fp16_scales(p.format);
  opts.precision = parse_precision_rules(p.precision);
  return opts;
}

bool is_weights_only_quant(const LoadedModel& loaded, QuantScheme scheme, OutputKind out) {
  return loaded.graph.nodes.empty() &&
         (scheme == QuantScheme::W4A16 || scheme == QuantScheme::Int8Weights) &&
         (out == OutputKind::HfFolder || out == OutputKind::Safetensors);
}

ConvertResult convert_weights_only_quant(const ConvertOptions& p, QuantScheme scheme,
                                         OutputKind out, LoadedModel& loaded,
                                         PipelineReport merged) {
  const bool layerwise = wants_layerwise_quant(p, loaded);
  check_flags(p, scheme, layerwise);
  if (p.format == "trtllm-ckpt") {  // its refusals come before any calibration
    QuantCheckpointOptions target;
    target.folder = out == OutputKind::HfFolder;
    if (loaded.format == FileFormat::HfFolder) target.source_dir = p.input;
    target.config = loaded.config_json;
    target.tensor_parallel = p.tensor_parallel;
    const bool w4 = scheme == QuantScheme::W4A16;
    check_trtllm_ckpt(target, w4 ? 4 : 8, w4 ? p.block_size : 0);
  }
  const Graph& graph = loaded.graph;
  const uint64_t bytes_in = graph.parameter_bytes();
  LinearWeightQuantOptions opts = folder_linear_options(p, scheme);
  const LinearWeightPlan plan = plan_linear_weight_quant(graph, opts);
  if (plan.quantize.empty() && !opts.precision.empty()) {
    fail_usage("--precision keeps every decoder Linear of '" + p.input +
               "' float: give at least one module int4 or int8, or convert without --quant");
  }
  if (plan.quantize.empty()) {
    fail_usage("--quant " + std::string(quant_scheme_name(scheme)) +
               " found no Linear weight in '" + p.input + "' (" +
               std::to_string(graph.initializers().size()) + " tensors): it quantizes 2-D tensors named model.layers.N.(self_attn|mlp)."
               "<q|k|v|o|gate|up|down|qkv|gate_up>_proj.weight, as a Hugging Face decoder has "
               "them; convert it without --quant, or export the model to ONNX and quantize that");
  }

  const std::string format =
      p.format.empty() ? std::string(quant_checkpoint_formats().front()) : p.format;
  // Bits per planned weight; the schemes they make, refused before any work where the layout
  // holds one only.
  std::unordered_map<std::string, int> bits_of;
  std::map<std::pair<int, int64_t>, std::string> schemes;  // -> its first module
  for (size_t i = 0; i < plan.quantize.size(); ++i) {
    bits_of[plan.quantize[i]] = plan.bits[i];
    schemes.emplace(std::make_pair(plan.bits[i], plan.bits[i] == 4 ? opts.block_size : 0),
                    module_of(plan.quantize[i]));
  }
  if (schemes.size() > 1 && !quant_checkpoint_holds_mixed_schemes(format)) {
    const auto& [a, am] = *schemes.begin();
    const auto& [b, bm] = *std::next(schemes.begin());
    fail_unsupported("--format " + format + " holds one scheme per checkpoint, and --precision "
                     "gives '" + am + "' " + quant_scheme_text(a.first, a.second) + " and '" + bm +
                     "' " + quant_scheme_text(b.first, b.second) +
                     ": write --format compressed-tensors (one config group per scheme)");
  }

  // The float tensors as read (windows of the mapped files): each part's inventory is checked
  // against them, whatever quantized it.
  std::unordered_map<std::string, Tensor> originals;
  std::optional<PassReport> layer_report;
  if (layerwise) {
    for (const auto& [name, tensor] : graph.initializers()) originals.emplace(name, tensor);
  }

  QuantCheckpointOptions wopts;
  wopts.folder = out == OutputKind::HfFolder;
  if (loaded.format == FileFormat::HfFolder) wopts.source_dir = p.input;
  wopts.config = loaded.config_json;
  if (loaded.config_json && wopts.folder) warn_no_tokenizer(p.input);
  wopts.max_shard_size = p.max_shard_size.value_or(wopts.folder ? kFolderShardSize : 0);
  wopts.overwrite = p.overwrite;
  wopts.tensor_parallel = p.tensor_parallel;
  wopts.header_reserve = quant_checkpoint_header_bound(graph);
  for (const FloatLinear& k : plan.kept) wopts.ignore.push_back(module_of(k.name));
  // A causal LM's lm_head is a Linear even when tied to the embeddings (no tensor of its own).
  if (loaded.hf_config && std::find(wopts.ignore.begin(), wopts.ignore.end(), "lm_head") ==
                              wopts.ignore.end()) {
    wopts.ignore.emplace_back("lm_head");
  }

  const auto start = std::chrono::steady_clock::now();
  PassReport report;
  report.pass = opts.bits == 4 ? "w4a16-linear" : "int8-weights-linear";
  report.stats["bits"] = opts.bits;
  report.stats["method"] = layerwise ? p.w4_method : std::string("rtn");
  if (schemes.begin()->first.first == 4) {  // int4 sorts first
    report.stats["block_size"] = opts.block_size;
    report.stats["scale"] = std::string(int4_scale_name(opts.int4_scale));
  }
  report.stats["quantized"] = 0;
  report.stats["float"] = 0;
  for (const PrecisionRule& r : opts.precision) {
    report.stats["precision"].push_back(precision_rule_text(r));
  }
  const std::unordered_set<std::string> targets(plan.quantize.begin(), plan.quantize.end());
  const std::unique_ptr<QuantCheckpointWriter> writer_ptr =
      make_quant_checkpoint_writer(format, p.output, wopts);
  QuantCheckpointWriter& writer = *writer_ptr;
  size_t done = 0;
  // The writer runs one part behind: while part i is written (I/O on one thread), part i + 1 is
  // quantized (the CPU threads). Parts reach the writer in order, one at a time, so the output
  // is the same; at most two quantized parts are held. A writer error surfaces at the next wait.
  std::future<void> writing;
  const auto wait_for_writer = [&writing] {
    if (writing.valid()) writing.get();
  };
  // One part per tensor: the quantized form of one weight at a time, checked, written, dropped.
  const auto emit = [&](const std::string& name, const Tensor& tensor) {
    const auto original = originals.find(name);
    Graph part;
    part.set_initializer(name, original == originals.end() ? tensor : original->second);
    const WeightInventory before = take_weight_inventory(part);
    part.set_initializer(name, tensor);
    if (const QuantRecord* r = graph.find_quant_record(name)) {  // quantized layer by layer
      part.set_initializer(r->scale, *graph.find_initializer(r->scale));
      part.add_quant_record(*r);
      ++done;
      report.count("quantized");
    } else if (targets.count(name) != 0) {
      LinearWeightQuantOptions one = opts;
      one.bits = bits_of.at(name);
      const LinearQuantStats s = quantize_linear_weight(part, name, one);
      ++done;
      spdlog::debug("[{}/{}] {} {} {} -> {}  SQNR {}", done, targets.size(), name,
                    shape_to_string(tensor.shape()), dtype_name(tensor.dtype()),
                    one.bits == 4 ? "i4 block " + std::to_string(one.block_size) : "i8",
                    sqnr_text(s.sqnr_db));
      report.stats["tensors"].push_back({{"name", name},
                                         {"shape", tensor.shape()},
                                         {"dtype", std::string(dtype_name(tensor.dtype()))},
                                         {"to", one.bits == 4 ? "i4" : "i8"},
                                         {"max_abs_error", s.max_abs_error},
                                         {"sqnr_db", sqnr_text(s.sqnr_db)}});
      report.count("quantized");
    } else {
      report.count("float");
    }
    check_nothing_lost(before, part, "the conversion of '" + p.input + "' to '" + p.output + "'");
    wait_for_writer();
    writing = std::async(std::launch::async,
                         [&writer, part = std::move(part),
                          read = original == originals.end() ? tensor : original->second] {
                           writer.add(part);
                           release_tensor_pages(read);
                         });
  };
  std::unordered_set<std::string> written;
  // Each record's scale is written beside its weight, never on its own.
  const auto is_scale = [&graph](const std::string& name) {
    for (const QuantRecord& r : graph.quant_records()) {
      if (r.scale == name) return true;
    }
    return false;
  };
  if (layerwise) {
    // A layer's tensors are final once it is done: written then, and dropped from the graph
    // (an empty tensor keeps the name's place), so that finished layers do not pile up.
    const auto write_layer = [&](int64_t i) {
      const std::string prefix = "model.layers." + std::to_string(i) + ".";
      std::vector<std::string> names;
      for (const auto& [name, tensor] : graph.initializers()) {
        if (name.starts_with(prefix) && !is_scale(name)) names.push_back(name);
      }
      for (const std::string& name : names) {
        emit(name, *graph.find_initializer(name));
        written.insert(name);
        std::vector<std::string> drop{name};
        if (const QuantRecord* r = graph.find_quant_record(name)) drop.push_back(r->scale);
        for (const std::string& d : drop) {
          const Tensor& t = *graph.find_initializer(d);
          loaded.graph.set_initializer(d, Tensor(t.dtype(), Shape{0}));
        }
      }
    };
    std::map<std::string, int> layer_bits(bits_of.begin(), bits_of.end());
    for (const FloatLinear& k : plan.kept) layer_bits[k.name] = 0;  // left float
    layer_report = quantize_folder_layerwise(p, scheme, loaded, layer_bits, write_layer);
  }
  for (const auto& [name, tensor] : graph.initializers()) {
    if (written.count(name) != 0 || is_scale(name)) continue;
    emit(name, tensor);
  }
  wait_for_writer();
  for (const FloatLinear& k : plan.kept) {
    report.stats["float_linears"].push_back(k.name + ": " + k.why);
  }
  writer.finish();
  report.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::string scheme_list;
  for (const auto& [sc, first] : schemes) {
    scheme_list += (scheme_list.empty() ? "" : ", ") + quant_scheme_text(sc.first, sc.second);
  }
  spdlog::info("{} Linear weights quantized ({}), {} tensors kept float", done, scheme_list,
               graph.initializers().size() - graph.quant_records().size() - done);

  ConvertResult result;
  result.act_dtype = DType::F32;
  result.weights_bytes_in = bytes_in;
  result.weights_bytes_out = writer.bytes_written();
  result.report = std::move(merged);
  if (layer_report) result.report.passes.push_back(std::move(*layer_report));
  result.report.passes.push_back(std::move(report));
  return result;
}

}  // namespace qforge::cli
