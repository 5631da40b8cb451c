#pragma once
// W4A16 round-to-nearest of one Linear weight [out, in] in groups of `block_size` consecutive
// values along `in`, on the CPU, in one pass over the weight: the bytes quantize_linear_weight
// stores for a CPU run (kernels/int4.h's scale rules and int4_math's rounding), without the
// f32 copy and the transposed copy of the whole tensor the generic kernel needs.
//
// The weight is cut into chunks of kInt4GroupLanes consecutive groups (a fixed size, not a
// per-thread share). A chunk is widened to f32 once, transposed into a small tile so that each
// group is a vector lane, searched, and its codes packed straight into the output; threads take
// whole chunks. Every group's scale and codes depend on its values only, and the error figures
// are summed per group in element order, then over groups in order: the same bytes and figures
// at any thread count.
//
// The Mse search gives the same scale bits as kernels/cpu/int4_cpu.cpp, with less work: every
// candidate's error is first summed in float (a screen), which rules out each candidate whose
// float sum exceeds the least one by more than the sums' rounding bound; the remaining ones
// (one for 98.3% of the groups of bench/bench_export.py's bf16 weights) get the exact double
// sum in element order, and the least exact error wins, ties to the earlier candidate, as
// there. One code per element serves the positive and the negative candidate of one
// magnitude, since round(w / -s) = -round(w / s) before the clamp to 7; w * q and q * q are
// summed only for the scales the refinement starts from. The AVX-512 and AVX2 screens take
// their codes from w times the reciprocal of s instead of a division; where those codes can
// differ from the division's, each squared term is within kInt4ScreenRho of the exact one,
// and the bound allows for it.
#include <cstdint>

#include "ir/tensor.h"
#include "kernels/int4.h"

namespace qforge {

inline constexpr int64_t kInt4GroupLanes = 16;

// How far (as a factor) a squared error term of the AVX-512 and AVX2 screens, whose codes come
// from round(w * fl(1 / s)), may lie from the exact search's term, whose codes come from
// round(fl(w / s)). tests/unit/quant/weights/test_int4_group_quant.cpp checks it on values
// next to every rounding boundary.
inline constexpr double kInt4ScreenRho = 1.0 + 0x1p-15;

struct Int4GroupQuant {
  Tensor values;  // I4 [out, in], ONNX nibble order (element 2i low, 2i + 1 high)
  Tensor scale;   // the weight's dtype, [out, in / block_size]
  double max_abs_error = 0.0;
  double signal = 0.0;  // sum of w^2
  double noise = 0.0;   // sum of (w - q * scale)^2
  bool finite = true;   // false: the weight holds NaN or Inf (nothing else is set)
};

// Which build of the chunk steps runs: the best this CPU has by default; the tests run each
// (the bytes are the same). One this CPU lacks falls back to the next below it.
enum class Int4GroupIsa { Best, Base, Avx2, Avx512 };
bool int4_group_isa_available(Int4GroupIsa isa);

// `weight`: 2-D f32, f16 or bf16, in % block_size == 0, block_size >= 1. Runs cpu_threads().
Int4GroupQuant quantize_int4_groups(const Tensor& weight, int64_t block_size, Int4Scale rule,
                                    Int4GroupIsa isa = Int4GroupIsa::Best);

}  // namespace qforge
