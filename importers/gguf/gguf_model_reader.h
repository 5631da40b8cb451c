#pragma once
// A GGUF file of a Llama-style decoder (llama, qwen2, qwen3 as llama.cpp's converter and qforge
// write them) read back as a Hugging Face checkpoint in qforge's weights-only form:
//  - GGUF names mapped back to Hugging Face names (ir/gguf_decoder_names.h), every tensor's
//    shape checked against the <arch>.* metadata;
//  - Llama's Q/K rows un-permuted (the inverse of convert_hf_to_gguf.py's permute()), integer
//    rows and their scale rows alike;
//  - the Linears of each layer (q/k/v/o/gate/up/down_proj) stored as Q4_0 become quantized
//    Linears (ir/quantized_linear.h): i4 values q = nibble - 8, group 32, the block's fp16 `d` as
//    the scale (negative where the file has it negative: q * d stays the GGUF value exactly);
//    Q8_0 becomes i8, group 32, likewise;
//  - a layer Linear stored as Q4_1 (asymmetric: d * q + m) has no symmetric form: it is read as
//    float32 (d * q + m computed as gguf.quants.dequantize computes it) and listed in `unfit`,
//    so that a caller writing a quantized layout can refuse it by name;
//  - the embeddings and the output projection (lm_head) are float32, dequantized exactly
//    (qforge's quantized layouts keep them float); F16, BF16 and F32 tensors as stored;
//  - config.json synthesized from the metadata.
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "importers/gguf/gguf_reader.h"
#include "ir/graph.h"

namespace qforge::gguf {

struct GgufDecoder {
  Graph graph;                     // Hugging Face names, quantized Linears in qforge's form
  nlohmann::ordered_json config;   // config.json for the Hugging Face architecture
  std::string arch;                // general.architecture
  int64_t q4_linears = 0;          // Q4_0 Linears read as int4 group 32
  int64_t q8_linears = 0;          // Q8_0 Linears read as int8 group 32
  std::vector<std::string> float_linears;  // Linear modules kept float ("lm_head", F16 ones)
  // Linears whose GGUF type has no symmetric integer form: "<hf name> (<gguf name>, Q4_1)".
  std::vector<std::string> unfit;
};

// Throws Unsupported naming the architecture when it is not one qforge maps, InvalidInput
// naming the tensor (or key) when a tensor is missing, unknown, or disagrees with the metadata.
GgufDecoder read_gguf_decoder(const GgufFile& file, std::span<const std::byte> bytes,
                              const std::string& path);
GgufDecoder read_gguf_decoder(const std::filesystem::path& path);

}  // namespace qforge::gguf
