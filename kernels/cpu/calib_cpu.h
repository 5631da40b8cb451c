#pragma once
// CPU backend of kernels/calib.h: ranges, histograms and the threshold searches as tasks of
// kernels/cpu/task_pool.h. Arguments are already validated by the dispatch in
// kernels/calib.cpp; see calib.h for the contract.
#include <cstdint>
#include <span>

#include "kernels/calib.h"

namespace qforge::cpu {

ValueRange minmax(std::span<const float> x);
uint64_t histogram_abs(std::span<const float> x, float scale, std::span<uint64_t> bins);
// The same over several pieces, as over their concatenation.
ValueRange minmax(FloatPieces pieces);
uint64_t histogram_abs(FloatPieces pieces, float scale, std::span<uint64_t> bins);
RangeHistogram range_histogram_abs_pow2(FloatPieces pieces, int floor_exponent,
                                        std::span<uint64_t> bins);
// scores[b][k] for candidate quant_levels + k of each of `hists` (any bin counts).
void entropy_scores_many(std::span<const std::span<const uint64_t>> hists, int quant_levels,
                         std::span<const std::span<double>> scores);
// For tests: the SSE2 baseline kernels (the searches on two lanes, the histogram's bins four at a
// time) even where the CPU has AVX2; or, with use_avx2_lanes_at_most, the AVX2 ones where it has
// AVX-512 (the ranges and the searches have AVX-512 kernels too). All give the same bits.
void use_baseline_lanes(bool on);
void use_avx2_lanes_at_most(bool on);
// scores[k] for candidate quant_max + 1 + k.
void mse_scores(std::span<const uint64_t> hist, int quant_max, std::span<double> scores);
// out[j] = calib_math::mse_bin_error(j, kept, quant_max) for j < kept (out.size() == kept), as the
// MSE search tabulates it: the same bits, W bins at a time. For tests.
void mse_inside_errors(int64_t kept, int quant_max, std::span<double> out);
// mse_scores of each of `hists` (any bin counts) into scores[b]: the same bits.
void mse_scores_many(std::span<const std::span<const uint64_t>> hists, int quant_max,
                     std::span<const std::span<double>> scores);

}  // namespace qforge::cpu
