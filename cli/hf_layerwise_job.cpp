#include "cli/hf_layerwise_job.h"

#include <cstdio>
#include <functional>

#include <spdlog/spdlog.h>

#include "cli/option_parsers.h"
#include "exporters/quant_checkpoint/quant_checkpoint_writer.h"
#include "importers/dataset/token_ids.h"
#include "importers/hf/decoder_builder.h"
#include "importers/hf/decoder_config.h"
#include "ir/error.h"
#include "quant/layerwise/layerwise_quantizer.h"

namespace qforge::cli {

namespace {

// One line per layer on stderr as each is done (none with -q): a layer of a large model takes
// seconds to minutes, so a line per layer is the progress, on a terminal and in CI alike.
// `done(i)` then hands the finished layer on (to the writer).
class LayerLines final : public LayerProgress {
 public:
  LayerLines(bool enabled, const std::function<void(int64_t)>& done)
      : enabled_(enabled), done_(done) {}
  void prologue_done(int64_t samples, int64_t tokens, double seconds) override {
    if (enabled_) {
      std::fprintf(stderr, "embedded %lld samples (%lld tokens) in %.2f s\n",
                   static_cast<long long>(samples), static_cast<long long>(tokens), seconds);
    }
  }
  void layer_done(const LayerResult& layer, int64_t num_layers) override {
    if (enabled_) std::fprintf(stderr, "%s\n", layerwise_progress_line(layer, num_layers).c_str());
    if (done_) done_(layer.index);
  }

 private:
  bool enabled_;
  const std::function<void(int64_t)>& done_;
};

}  // namespace

bool wants_layerwise_quant(const ConvertOptions& p, const LoadedModel& loaded) {
  if (loaded.format != FileFormat::HfFolder) return false;
  const bool calibrated_method = p.w4_method == "awq" || p.w4_method == "gptq";
  if (calibrated_method && p.calib.data.empty()) {
    fail_usage("--w4-method " + p.w4_method + " calibrates on token ids: give --calib ids.npz "
               "(input_ids, attention_mask) or ids.jsonl (calib_data/README.md, \"Token ids\")");
  }
  return !p.calib.data.empty();
}

PassReport quantize_folder_layerwise(const ConvertOptions& p, QuantScheme scheme,
                                     LoadedModel& loaded, const std::map<std::string, int>& bits,
                                     const std::function<void(int64_t)>& layer_done) {
  const DecoderConfig config = read_decoder_config(p.input);
  const auto parts = build_decoder_parts(config, loaded.graph);

  TokenIdOptions ids_options;
  ids_options.calib_size = p.calib.calib_size;
  ids_options.seq_len = p.seq_len;
  ids_options.batch = p.calib.batch;
  ids_options.vocab_size = config.vocab_size;
  TokenIds ids(p.calib.data, ids_options);

  LayerwiseOptions options;
  options.scheme =
      scheme == QuantScheme::W4A16 ? LayerwiseScheme::W4A16 : LayerwiseScheme::Int8PerChannel;
  options.method = parse_w4_method(p.w4_method);
  options.block_size = p.block_size;
  if (!p.w4_scale.empty()) options.scale = parse_int4_scale(p.w4_scale);
  options.threads = p.threads;
  options.device = parse_device(p.device);
  options.fp16_scales = quant_checkpoint_stores_fp16_scales(p.format);
  options.bits = bits;

  spdlog::info("layer-wise {} ({}) of '{}': {} layers on {} samples of '{}' ({} tokens each)",
               quant_scheme_name(scheme), p.w4_method, p.input, parts->num_layers(), ids.size(),
               p.calib.data, ids.seq_len());
  LayerLines lines(p.show_progress, layer_done);
  const LayerwiseResult result = quantize_layerwise(*parts, loaded.graph, ids, options, &lines);

  PassReport report;
  report.pass = "layerwise";
  report.seconds = result.seconds;
  report.stats = layerwise_result_json(result);
  return report;
}

}  // namespace qforge::cli
