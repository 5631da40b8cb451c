#pragma once
// What `qforge inspect DIR` adds for a Hugging Face model folder: the decoder figures of its
// config.json and what its weights actually hold; for a quantized checkpoint (compressed-tensors)
// its scheme: format, bits, group size, symmetric, how many Linears are quantized and which
// stayed float ("quantization", null for a float folder).
#include "cli/app.h"
#include "importers/load_model.h"

namespace qforge::cli {

Json describe_hf_folder(const LoadedModel& loaded);
void print_hf_text(const Json& hf_json);

}  // namespace qforge::cli
