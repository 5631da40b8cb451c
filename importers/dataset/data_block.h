#pragma once
// Internal to importers/dataset: one unit of a data set on disk (an .npz, an .npy, an ONNX
// Runtime test_data_set folder) as named arrays that share a leading sample axis. Dataset
// (dataset.h) validates them against the model and cuts batches out of them.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "ir/tensor.h"

namespace qforge::dataset_detail {

struct BlockArray {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;  // as stored
};

class DataBlock {
 public:
  virtual ~DataBlock() = default;
  // `source` names the block in messages ("'calib.npz'").
  [[nodiscard]] const std::string& source() const { return source_; }
  [[nodiscard]] const std::vector<BlockArray>& arrays() const { return arrays_; }

  // Rows [first, first + count) of array `index` along axis 0, as a tensor [count, ...]: a
  // window of the file where the data lies aligned in it, else an owned copy. A rank-0 array
  // reads as a whole (first 0, count 1). Reads in increasing order are cheapest; reading
  // backwards restarts a compressed entry.
  virtual Tensor read(size_t index, int64_t first, int64_t count) = 0;

 protected:
  explicit DataBlock(std::string source) : source_(std::move(source)) {}
  std::string source_;
  std::vector<BlockArray> arrays_;
};

// np.savez / np.savez_compressed archive: one array per NAME.npy entry.
std::unique_ptr<DataBlock> open_npz_block(const std::filesystem::path& path);
// One .npy file: a single array named "" (the Dataset gives it the model's only input).
std::unique_ptr<DataBlock> open_npy_block(const std::filesystem::path& path);
// A folder of ONNX Runtime test data: input_<k>.pb (TensorProto; named by the proto's name, else
// the k-th of `inputs`) and output_<k>.pb (named by the proto, else "output_<k>").
std::unique_ptr<DataBlock> open_pb_block(const std::filesystem::path& dir,
                                         const std::vector<ValueInfo>& inputs);

// Bytes of one row (all axes but the first) of `a`; 0 for a rank-0 array.
uint64_t row_bytes(const BlockArray& a);

}  // namespace qforge::dataset_detail
