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
// NaN or Inf in a float input is an error in the data, refused unless the caller drops such
// samples or keeps them (BadSamples); Inf that a model computes from finite data (an additive
// mask) is no concern here.
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

// What a Dataset does with a sample whose float inputs hold NaN or Inf.
enum class BadSamples {
  Refuse,  // next() throws Error(InvalidInput) naming the file, the input, how many values
           // in how many samples, and the first such sample
  Drop,    // skipped: the constructor reads the data set once to find them, logs one line
           // counting them, and throws Error(InvalidInput) when none is left
  Keep,    // served as they are (`qforge run` feeds its inputs as given)
};

class Dataset final : public BatchSource {
 public:
  // `inputs`: the model inputs to feed (graph inputs that are not initializers), in order.
  // `calib_size`: samples to serve per pass (0 = all). `batch` >= 1. `role` starts messages
  // ("calibration data", "evaluation data"). Throws Error(IO) for a path that cannot be
  // read, InvalidInput for data that does not fit the model, Unsupported for formats qforge
  // does not read, Usage for a bad calib_size or batch. With BadSamples::Drop, `calib_size`
  // counts the samples kept.
  Dataset(const std::filesystem::path& path, std::vector<ValueInfo> inputs, int64_t calib_size = 0,
          int64_t batch = 1, std::string_view role = "calibration data",
          BadSamples bad_samples = BadSamples::Refuse);
  ~Dataset() override;

  // The next batch, one tensor per model input in model order ([b, ...]); false after the
  // last. Tensors may be windows of a memory-mapped file: copy them to keep them past the
  // Dataset. `extras`, when given, receives the rows of the extra arrays (extra_names()).
  bool next(Feeds& batch, Feeds* extras = nullptr) override;
  void rewind() override;

  [[nodiscard]] int64_t size() const override { return size_; }            // samples per pass
  [[nodiscard]] int64_t available() const { return available_; }  // samples on disk
  [[nodiscard]] int64_t dropped() const {  // samples skipped for NaN or Inf (BadSamples::Drop)
    return static_cast<int64_t>(dropped_.size());
  }
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
  // "calibration data 'calib.npz' sample 7"; in a folder, the file and its row, then the
  // sample's place in the data set. Counts the samples served, dropped ones skipped.
  [[nodiscard]] std::string sample_origin(int64_t sample) const override;

 private:
  struct BlockInfo;
  struct Cursor;

  void scan(const std::filesystem::path& path);
  dataset_detail::DataBlock& open_block(size_t index);
  [[nodiscard]] std::string where(const dataset_detail::DataBlock& block) const;
  // next() without the NaN/Inf check.
  bool read_batch(Feeds& batch, Feeds* extras);
  // Samples (data-set order) of `batch` holding NaN or Inf in a float input, as positions in
  // the batch; fills `input` with the first such input of the first such sample.
  std::vector<int64_t> bad_rows(const Feeds& batch, size_t* input) const;
  // BadSamples::Drop: one pass to list them.
  void find_bad_samples(int64_t calib_size);
  // BadSamples::Refuse: counts what the pass holds and throws.
  [[noreturn]] void refuse_bad_sample(int64_t first_bad, size_t input);
  // The file and row of sample `index` of the data set (on disk, nothing skipped).
  [[nodiscard]] std::pair<size_t, int64_t> locate(int64_t index) const;

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
  BadSamples bad_samples_ = BadSamples::Refuse;
  std::vector<int64_t> dropped_;  // samples skipped (data-set order, ascending)
  std::unique_ptr<Cursor> cursor_;
  std::string digest_;
};

}  // namespace qforge
