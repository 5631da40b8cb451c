// ONNX Runtime's test-data layout as a data block: a test_data_set_<n>/ folder of serialized
// TensorProtos, input_<k>.pb and output_<k>.pb.
#include <algorithm>
#include <charconv>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <set>

#include <onnx/onnx_pb.h>

#include "importers/dataset/data_block.h"
#include "importers/onnx/onnx_tensor.h"
#include "importers/torch/byte_io.h"
#include "ir/error.h"
#include "ir/mapped_file.h"

namespace qforge::dataset_detail {

using torch_detail::printable;
using torch_detail::quote;

namespace {

// k for a file named <prefix><k>.pb, else nullopt.
std::optional<int64_t> numbered(const std::string& file, std::string_view prefix) {
  if (file.size() <= prefix.size() + 3 || file.compare(0, prefix.size(), prefix) != 0 ||
      file.compare(file.size() - 3, 3, ".pb") != 0) {
    return std::nullopt;
  }
  const char* first = file.data() + prefix.size();
  const char* last = file.data() + file.size() - 3;
  int64_t k = 0;
  const auto [end, ec] = std::from_chars(first, last, k);
  if (ec != std::errc() || end != last || k < 0) return std::nullopt;
  return k;
}

class PbBlock final : public DataBlock {
 public:
  explicit PbBlock(std::string source) : DataBlock(std::move(source)) {}

  void add(std::string name, Tensor t) {
    arrays_.push_back({std::move(name), t.dtype(), t.shape()});
    tensors_.push_back(std::move(t));
  }

  Tensor read(size_t index, int64_t first, int64_t count) override {
    const Tensor& t = tensors_.at(index);
    if (t.rank() == 0) return t;
    const uint64_t rb = row_bytes(arrays_[index]);
    Shape shape = t.shape();
    shape[0] = count;
    const size_t at = t.offset() + static_cast<size_t>(first) * rb;
    const size_t elem = std::max<size_t>(1, static_cast<size_t>(dtype_bits(t.dtype())) / 8);
    if (at % elem == 0) return {t.dtype(), std::move(shape), t.storage(), at};
    Tensor copy(t.dtype(), std::move(shape));  // external data misaligned for its dtype
    std::memcpy(copy.mutable_bytes().data(), t.storage()->bytes().data() + at, copy.nbytes());
    return copy;
  }

 private:
  std::vector<Tensor> tensors_;
};

Tensor read_tensor_file(const std::filesystem::path& file, const std::filesystem::path& dir,
                        onnx::TensorProto& proto) {
  const auto mapped = MappedFile::open(file);
  const std::string label = quote(file.string());
  if (mapped->size() > static_cast<size_t>(std::numeric_limits<int>::max())) {
    fail_unsupported(label +
                     " is over 2 GiB, beyond what protobuf parses; store the tensor as "
                     "external data or use an .npz");
  }
  if (!proto.ParseFromArray(mapped->bytes().data(), static_cast<int>(mapped->size()))) {
    fail_invalid(label +
                 " is not a serialized ONNX TensorProto; write it with "
                 "onnx.numpy_helper.from_array(...).SerializeToString()");
  }
  OnnxTensorReader reader(dir, file.string());
  return reader.read(proto, "tensor " + quote(printable(proto.name())));
}

}  // namespace

std::unique_ptr<DataBlock> open_pb_block(const std::filesystem::path& dir,
                                         const std::vector<ValueInfo>& inputs) {
  std::map<int64_t, std::filesystem::path> in_files, out_files;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string file = entry.path().filename().string();
    if (const auto k = numbered(file, "input_")) in_files[*k] = entry.path();
    if (const auto k = numbered(file, "output_")) out_files[*k] = entry.path();
  }
  auto block = std::make_unique<PbBlock>(quote(dir.string()));
  if (in_files.empty()) {
    fail_invalid(quote(dir.string()) +
                 " holds no input_<k>.pb files (ONNX Runtime's "
                 "test_data_set layout)");
  }
  std::set<std::string> seen;
  // An unnamed proto takes `fallback`: the k-th model input, or output_<k>.
  auto add = [&](const std::filesystem::path& file, const std::string& fallback) {
    onnx::TensorProto proto;
    Tensor t = read_tensor_file(file, dir, proto);
    std::string name = proto.name().empty() ? fallback : proto.name();
    if (name.empty()) {
      fail_invalid(quote(file.string()) + " has no tensor name and its number is beyond the " +
                   "model's " + std::to_string(inputs.size()) +
                   " input(s); name the tensor after a model input");
    }
    if (!seen.insert(name).second) {
      fail_invalid(quote(file.string()) + " holds tensor " + quote(printable(name)) +
                   ", which another file of " + quote(dir.string()) + " holds too");
    }
    block->add(std::move(name), std::move(t));
  };
  for (const auto& [k, file] : in_files) {
    add(file, k < static_cast<int64_t>(inputs.size()) ? inputs[static_cast<size_t>(k)].name : "");
  }
  for (const auto& [k, file] : out_files) add(file, "output_" + std::to_string(k));
  return block;
}

}  // namespace qforge::dataset_detail
