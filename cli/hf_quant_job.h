#pragma once
// `qforge convert IN --quant w4a16|int8-weights -o OUT` for a weights-only input (a Hugging Face
// model folder, a .safetensors file, a sharded index, a torch .bin): the decoder's Linear weights
// quantized (quant/weights/linear_weight_quant.h) and written in compressed-tensors'
// pack-quantized layout (exporters/compressed_tensors/), to a model folder or a .safetensors file.
// One tensor at a time: each is quantized when the writer reaches it, written, then dropped and
// its mapped pages released, so memory stays bounded whatever the model's size.
#include "cli/convert_job.h"
#include "cli/output_path.h"
#include "importers/load_model.h"
#include "quant/schemes.h"
#include "quant/weights/linear_weight_quant.h"

namespace qforge::cli {

// The Linear quantization options of a weight-only --quant w4a16|int8-weights of a model folder
// (bits, block size, int4 scale rule, device, the layout's fp16 scales, --precision rules).
LinearWeightQuantOptions folder_linear_options(const ConvertOptions& p, QuantScheme scheme);

// Whether convert_model hands a loaded input to convert_weights_only_quant: a weights-only graph,
// a weight-only scheme, and a folder or .safetensors output.
bool is_weights_only_quant(const LoadedModel& loaded, QuantScheme scheme, OutputKind out);

// Throws Usage for flags that do not apply (naming them) and when no weight matches the Linear
// rules (saying what to pass instead); the output is written whole or not at all.
// `merged`: what ran before on `loaded.graph` (the --lora merge), reported first. With --calib on
// a model folder the Linears are quantized layer by layer first (cli/hf_layerwise_job.h).
ConvertResult convert_weights_only_quant(const ConvertOptions& options, QuantScheme scheme,
                                         OutputKind out, LoadedModel& loaded,
                                         PipelineReport merged);

}  // namespace qforge::cli
