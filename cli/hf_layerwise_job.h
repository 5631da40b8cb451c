#pragma once
// `qforge convert DIR --quant w4a16|int8-weights --calib IDS -o OUT`: a model folder quantized
// layer by layer on token-id calibration data (quant/layerwise/layerwise_quantizer.h) over the
// decoder the folder's config.json describes (importers/hf/decoder_builder.h). The quantized
// Linears land in the folder's weights-only graph in the form of ir/quantized_linear.h, which
// the compressed-tensors writer then packs (cli/hf_quant_job.h).
#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "cli/convert_job.h"
#include "importers/load_model.h"
#include "ir/pass.h"
#include "quant/schemes.h"

namespace qforge::cli {

// True when a weights-only quantization of `loaded` calibrates: a model folder with --calib,
// or --w4-method awq|gptq (which then needs --calib: Usage naming it otherwise).
bool wants_layerwise_quant(const ConvertOptions& options, const LoadedModel& loaded);

// Quantizes every decoder Linear of `loaded.graph` layer by layer. A progress line per layer on
// stderr (unless -q); the figures per layer go into the returned report ("layerwise").
// `bits`: the precision of each decoder Linear weight by name (4, 8, or 0 for float; the scheme's
// where absent), as the --precision rules planned it.
// `layer_done(i)`, when set, is called as soon as layer i is final (its Linears quantized, its
// norms folded): the tensors named model.layers.<i>.* are not read or changed after it.
PassReport quantize_folder_layerwise(const ConvertOptions& options, QuantScheme scheme,
                                     LoadedModel& loaded, const std::map<std::string, int>& bits,
                                     const std::function<void(int64_t)>& layer_done = {});

}  // namespace qforge::cli
