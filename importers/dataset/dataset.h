#pragma once
// A calibration (or evaluation) data set, streamed in batches: never loaded whole.
//
// Formats (samples lie along axis 0; see calib_data/README.md):
//   FILE.npz       one array per model input, keyed by input name (np.savez or
//                  np.savez_compressed); other keys (e.g. `labels`) are extras
//   FILE.npy       one array, for a model with one input
//   FOLDER/        *.npz and *.npy files in byte order of their names, each one sample (arrays
//                  without the sample axis) or several; a .npy only for single-input models
//   FOLDER/        ONNX Runtime's layout: test_data_set_<n>/input_<k>.pb (serialized
//                  TensorProtos named by their name field, else the k-th model input) in order
//                  of n, or one such folder itself; output_<k>.pb become extras
// Names, dtypes and shapes are checked against the model's inputs when the data set is opened
// (fixed dimensions must match, symbolic ones are free), with one-line errors naming the file,
// the input and the mismatch. A model whose leading dimension is fixed at k gets batches of
// exactly k samples; otherwise batches hold up to `batch` samples and end early where the
// samples' shapes change (a folder of different-length sequences).
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ir/batch_source.h"
#include "ir/graph.h"
#include "ir/tensor.h"

namespace qforge {

namespace dataset_detail {
class DataBlock;
}

class Dataset final : public BatchSource {
 public:
  // `inputs`: the model inputs to feed (graph inputs that are not initializers), in order.
  // `calib_size`: samples to serve per pass (0 = all). `batch` >= 1. `role` starts messages
  // ("calibration data", "evaluation data"). Throws Error(IO) for a path that cannot be
  // read, InvalidInput for data that does not fit the model, Unsupported for formats qforge
  // does not read, Usage for a bad calib_size or batch.
  Dataset(const std::filesystem::path& path, std::vector<ValueInfo> inputs, int64_t calib_size = 0,
          int64_t batch = 1, std::string_view role = "calibration data");
  ~Dataset() override;

  // The next batch, one tensor per model input in model order ([b, ...]); false after the
  // last. Tensors may be windows of a memory-mapped file: copy them to keep them past the
  // Dataset. `extras`, when given, receives the rows of the extra arrays (extra_names()).
  bool next(Feeds& batch, Feeds* extras = nullptr) override;
  void rewind() override;

  [[nodiscard]] int64_t size() const override { return size_; }            // samples per pass
  [[nodiscard]] int64_t available() const { return available_; }  // samples on disk
  [[nodiscard]] int64_t batch() const { return batch_; }
  [[nodiscard]] const std::string& format() const {
    return format_;
  }  // "npz", "npy", "folder", "onnx-test-data"
  [[nodiscard]] const std::string& source() const override { return source_; }
  // Arrays served alongside the inputs (`labels`, output_<k>), aligned with the samples.
  [[nodiscard]] const std::vector<std::string>& extra_names() const { return extra_names_; }

  // SHA-256 (hex) of the samples served per pass, in order: each sample contributes each model
  // input's bytes (C order, little-endian) in model-input order, so for one input it is
  // sha256(x[:size].tobytes()) whatever the file layout or batch size. Computed while a whole
  // pass is read; otherwise digest() reads one itself, rewinding before and after.
  std::string digest() override;

 private:
  struct BlockInfo;
  struct Cursor;

  void scan(const std::filesystem::path& path);
  dataset_detail::DataBlock& open_block(size_t index);
  [[nodiscard]] std::string where(const dataset_detail::DataBlock& block) const;

  std::vector<ValueInfo> inputs_;
  std::string role_;
  std::string source_;
  std::string format_;
  std::vector<BlockInfo> blocks_;
  std::vector<std::string> extra_names_;
  int64_t available_ = 0;
  int64_t size_ = 0;
  int64_t batch_ = 1;
  bool fixed_batch_ = false;  // the model's leading dimension is fixed
  std::unique_ptr<Cursor> cursor_;
  std::string digest_;
};

}  // namespace qforge
