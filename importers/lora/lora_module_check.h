#pragma once
// Checks shared by the PEFT and Kohya builders: the factors of one module are consistent.
#include <string>

#include "importers/lora/lora_adapter.h"

namespace qforge {

// Sets module.kind for lora_A/lora_B factors (Linear for rank 2, Conv above) and checks shapes:
// A [r, in, ...], B [out, r, 1...] (Embedding: A [r, num], B [dim, r]), float dtypes, the rank
// equal to module.r, magnitude and bias with `out` elements. Throws InvalidInput naming the
// module and `where`.
void check_lora_module(LoraModule& module, const std::string& where);

}  // namespace qforge
