#pragma once
// What `qforge inspect DIR` adds for a Hugging Face model folder: the decoder figures of its
// config.json and what its weights actually hold.
#include "cli/app.h"
#include "importers/load_model.h"

namespace qforge::cli {

Json describe_hf_folder(const LoadedModel& loaded);
void print_hf_text(const Json& hf_json);

}  // namespace qforge::cli
