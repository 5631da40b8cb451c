#pragma once
// Internal to importers/dataset: how one data block's arrays map onto the model's inputs, and
// the checks that decide it (dtype, fixed dimensions, equal sample counts), each failing with
// one line naming the block, the input and the mismatch.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "importers/dataset/data_block.h"
#include "ir/graph.h"

namespace qforge::dataset_detail {

enum class BlockKind { Npz, Npy, Pb };

struct BlockLayout {
  int64_t rows = 0;                 // samples in the block
  std::vector<size_t> input_array;  // per model input: index in the block's arrays
  std::vector<bool> sample_axis;    // per model input: whether axis 0 is the samples (a
                                    // per-sample file may leave it out)
  std::vector<Shape> row_shapes;    // per model input: shape of one sample
  struct Extra {
    size_t array = 0;
    bool sample_axis = true;
    DType dtype = DType::F32;
    Shape row_shape;
    bool operator==(const Extra& o) const { return dtype == o.dtype && row_shape == o.row_shape; }
  };
  std::map<std::string, Extra> extras;  // arrays aligned with the samples that feed no input
};

// `here` starts messages ("calibration data 'x.npz'"); `single_array_file` for an .npy.
BlockLayout match_inputs(const DataBlock& block, const std::vector<ValueInfo>& inputs,
                         const std::string& here, bool single_array_file);

// Shape of one sample of `a`: without axis 0 when it is the sample axis.
Shape row_shape(const BlockArray& a, bool sample_axis);

}  // namespace qforge::dataset_detail
