#pragma once
// `qforge convert QDIR ...` where QDIR is a quantized checkpoint qforge reads back
// (importers/quantized_checkpoint: compressed-tensors, GPTQ, AWQ, ModelOpt, TensorRT-LLM).
//  - To a model folder or .safetensors without --quant, or with the checkpoint's own scheme
//    (--quant w4a16 --block-size G on a group-G int4 folder, int8-weights on a per-channel int8
//    one): the same integers and scales re-emitted (reemit_quantized_checkpoint), nothing
//    requantized.
//  - Another scheme is refused, naming both, unless --requantize is given: then the Linears are
//    dequantized (q * scale, in the scale's dtype) and quantized again by the usual path, and
//    one info line says so.
//  - To .onnx or a bundle, the decoder graph dequantizes each Linear when it is built
//    (importers/hf/decoder_builder.h); --quant there quantizes those weights again, so it too
//    needs --requantize.
#include "cli/convert_job.h"
#include "cli/output_path.h"
#include "importers/load_model.h"
#include "quant/schemes.h"

namespace qforge::cli {

// Checks --quant and --requantize against what `loaded` holds; with --requantize and a scheme
// to apply, dequantizes the checkpoint's Linears in place (loaded.quantized cleared). Returns
// true when the checkpoint is to be re-emitted as it is. Usage error before anything is written.
bool keep_checkpoint_scheme(const ConvertOptions& p, QuantScheme scheme, OutputKind out,
                            LoadedModel& loaded);

// One warning line: `input` (a GGUF file, a TensorRT-LLM checkpoint) gives the output folder a
// synthesized config.json and no tokenizer files.
void warn_no_tokenizer(const std::string& input);

// Writes the checkpoint's quantized Linears and float tensors unchanged as compressed-tensors
// (a folder or one .safetensors), keeping its `ignore` list.
ConvertResult reemit_quantized_checkpoint(const ConvertOptions& p, OutputKind out,
                                          const LoadedModel& loaded);

}  // namespace qforge::cli
