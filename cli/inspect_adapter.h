#pragma once
#include <string>

#include "cli/app.h"
#include "importers/lora/lora_adapter.h"

namespace qforge::cli {

Json describe_adapter(const std::string& file, const LoraAdapter& adapter);
void print_adapter_text(const Json& adapter_json);

}  // namespace qforge::cli
