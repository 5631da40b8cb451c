#include "importers/dataset/dataset.h"

#include <algorithm>
#include <charconv>
#include <cstring>
#include <map>
#include <optional>

#include "importers/dataset/data_block.h"
#include "importers/dataset/sha256.h"
#include "importers/torch/byte_io.h"
#include "ir/error.h"

namespace qforge {

using dataset_detail::BlockArray;
using dataset_detail::DataBlock;
using torch_detail::printable;
using torch_detail::quote;

namespace {

enum class BlockKind { Npz, Npy, Pb };

std::string dims_string(const std::vector<Dim>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i > 0) s += ", ";
    s += dims[i].value ? std::to_string(*dims[i].value) : dims[i].param.empty() ? "?" : dims[i].param;
  }
  return s + "]";
}

std::string_view numpy_name(DType dtype) {
  switch (dtype) {
    case DType::F32: return "float32";
    case DType::F16: return "float16";
    case DType::F64: return "float64";
    case DType::I64: return "int64";
    case DType::I32: return "int32";
    case DType::I16: return "int16";
    case DType::I8: return "int8";
    case DType::U8: return "uint8";
    case DType::Bool: return "bool";
    default: return dtype_name(dtype);
  }
}

// n for a folder named test_data_set_<n>.
std::optional<int64_t> test_set_number(const std::string& name) {
  constexpr std::string_view kPrefix = "test_data_set_";
  if (name.size() <= kPrefix.size() || name.compare(0, kPrefix.size(), kPrefix) != 0) return {};
  int64_t n = 0;
  const auto [end, ec] = std::from_chars(name.data() + kPrefix.size(), name.data() + name.size(), n);
  if (ec != std::errc() || end != name.data() + name.size()) return {};
  return n;
}

bool has_input_pb(const std::filesystem::path& dir) {
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const std::string f = e.path().filename().string();
    if (f.rfind("input_", 0) == 0 && f.size() > 9 && f.compare(f.size() - 3, 3, ".pb") == 0) {
      return true;
    }
  }
  return false;
}

Shape row_shape(const BlockArray& a, bool sample_axis) {
  return sample_axis ? Shape(a.shape.begin() + 1, a.shape.end()) : a.shape;
}

// Rows of several pieces, one after another, as one owned tensor.
Tensor concatenate(const std::vector<Tensor>& pieces) {
  if (pieces.size() == 1) return pieces.front();
  Shape shape = pieces.front().shape();
  shape[0] = 0;
  for (const Tensor& p : pieces) shape[0] += p.shape()[0];
  Tensor out(pieces.front().dtype(), shape);
  std::byte* dst = out.mutable_bytes().data();
  for (const Tensor& p : pieces) {
    std::memcpy(dst, p.bytes().data(), p.nbytes());
    dst += p.nbytes();
  }
  return out;
}

}  // namespace

struct Dataset::BlockInfo {
  std::filesystem::path path;
  BlockKind kind = BlockKind::Npz;
  int64_t rows = 0;
  std::vector<size_t> input_array;         // per model input: index in the block's arrays
  std::vector<bool> sample_axis;           // per model input: whether axis 0 is the samples
  std::vector<Shape> row_shapes;           // per model input: shape of one sample
  struct Extra {
    size_t array = 0;
    bool sample_axis = true;
    DType dtype = DType::F32;
    Shape row_shape;
    bool operator==(const Extra& o) const {
      return dtype == o.dtype && row_shape == o.row_shape;
    }
  };
  std::map<std::string, Extra> extras;     // aligned extra arrays by name
};

struct Dataset::Cursor {
  size_t block = 0;
  int64_t row = 0;
  int64_t served = 0;
  size_t open_index = SIZE_MAX;
  std::unique_ptr<DataBlock> open;
  Sha256 hasher;
  bool hashing = true;  // every sample of this pass so far went into the hasher
};

Dataset::Dataset(const std::filesystem::path& path, std::vector<ValueInfo> inputs,
                 int64_t calib_size, int64_t batch, std::string_view role)
    : inputs_(std::move(inputs)), role_(role), source_(path.string()),
      cursor_(std::make_unique<Cursor>()) {
  if (calib_size < 0) {
    fail_usage("calibration size " + std::to_string(calib_size) + ": use 0 (all) or a count");
  }
  if (batch < 1) fail_usage("batch " + std::to_string(batch) + ": use 1 or more samples");
  if (inputs_.empty()) fail_unsupported("the model has no inputs to feed from " + quote(source_));
  batch_ = batch;
  for (const ValueInfo& in : inputs_) {
    if (in.shape && in.shape->empty()) {
      fail_unsupported("model input " + quote(in.name) + " is a scalar; data sets feed samples "
                       "along a leading batch axis");
    }
    if (in.shape && (*in.shape)[0].value) {  // a fixed batch: every batch is exactly that size
      batch_ = *(*in.shape)[0].value;
      fixed_batch_ = true;
      if (batch_ < 1) fail_unsupported("model input " + quote(in.name) + " has a batch of 0");
      break;
    }
  }
  scan(path);
  size_ = calib_size == 0 ? available_ : std::min(calib_size, available_);
  if (fixed_batch_) size_ -= size_ % batch_;
  if (size_ == 0) {
    fail_invalid(role_ + " " + quote(source_) + " holds " + std::to_string(available_) +
                 " sample(s), fewer than the model's fixed batch of " + std::to_string(batch_));
  }
}

Dataset::~Dataset() = default;

std::string Dataset::where(const DataBlock& block) const { return role_ + " " + block.source(); }

void Dataset::scan(const std::filesystem::path& path) {
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (ec || !std::filesystem::exists(status)) {
    fail_io("cannot open " + role_ + " " + quote(source_) + ": no such file or folder");
  }
  std::vector<std::pair<std::filesystem::path, BlockKind>> found;
  auto kind_of = [](const std::filesystem::path& p) -> std::optional<BlockKind> {
    if (p.extension() == ".npz") return BlockKind::Npz;
    if (p.extension() == ".npy") return BlockKind::Npy;
    return std::nullopt;
  };
  if (std::filesystem::is_regular_file(status)) {
    const auto kind = kind_of(path);
    if (!kind) {
      fail_unsupported(role_ + " " + quote(source_) + " is neither .npz nor .npy; give an .npz, "
                       "an .npy, a folder of them, or ONNX Runtime test_data_set_* folders");
    }
    found.emplace_back(path, *kind);
    format_ = *kind == BlockKind::Npz ? "npz" : "npy";
  } else if (std::filesystem::is_directory(status)) {
    std::map<int64_t, std::filesystem::path> test_sets;
    std::map<std::string, std::pair<std::filesystem::path, BlockKind>> files;  // byte order
    for (const auto& e : std::filesystem::directory_iterator(path)) {
      const std::string name = e.path().filename().string();
      if (name.empty() || name[0] == '.') continue;
      if (e.is_directory()) {
        if (const auto n = test_set_number(name)) test_sets[*n] = e.path();
      } else if (const auto kind = kind_of(e.path()); kind && e.is_regular_file()) {
        files[name] = {e.path(), *kind};
      }
    }
    if (!test_sets.empty()) {
      for (const auto& [n, dir] : test_sets) found.emplace_back(dir, BlockKind::Pb);
      format_ = "onnx-test-data";
    } else if (has_input_pb(path)) {
      found.emplace_back(path, BlockKind::Pb);
      format_ = "onnx-test-data";
    } else {
      for (const auto& [name, file] : files) found.push_back(file);
      format_ = "folder";
    }
    if (found.empty()) {
      fail_invalid(role_ + " folder " + quote(source_) + " holds no .npz or .npy files and no "
                   "test_data_set_* folders");
    }
  } else {
    fail_io(role_ + " " + quote(source_) + " is neither a file nor a folder");
  }
  for (size_t i = 0; i < found.size(); ++i) {
    BlockInfo info;
    info.path = found[i].first;
    info.kind = found[i].second;
    blocks_.push_back(std::move(info));
    check_block(i, open_block(i));
    available_ += blocks_[i].rows;
  }
  if (available_ == 0) fail_invalid(role_ + " " + quote(source_) + " holds no samples");
  // Extras every block holds alike.
  for (const auto& [name, extra] : blocks_.front().extras) {
    const bool everywhere = std::all_of(blocks_.begin(), blocks_.end(), [&](const BlockInfo& b) {
      const auto it = b.extras.find(name);
      return it != b.extras.end() && it->second == extra;
    });
    if (everywhere) extra_names_.push_back(name);
  }
}

DataBlock& Dataset::open_block(size_t index) {
  Cursor& c = *cursor_;
  if (c.open_index != index) {
    c.open.reset();  // one block open at a time
    c.open_index = SIZE_MAX;
    const BlockInfo& b = blocks_[index];
    switch (b.kind) {
      case BlockKind::Npz: c.open = dataset_detail::open_npz_block(b.path); break;
      case BlockKind::Npy: c.open = dataset_detail::open_npy_block(b.path); break;
      case BlockKind::Pb: c.open = dataset_detail::open_pb_block(b.path, inputs_); break;
    }
    c.open_index = index;
  }
  return *c.open;
}

void Dataset::check_block(size_t index, DataBlock& block) {
  BlockInfo& info = blocks_[index];
  const std::vector<BlockArray>& arrays = block.arrays();
  const std::string here = where(block);
  std::vector<bool> used(arrays.size(), false);
  std::optional<int64_t> rows;
  std::string rows_from;
  for (const ValueInfo& in : inputs_) {
    size_t a = arrays.size();
    for (size_t k = 0; k < arrays.size(); ++k) {
      // A .npy holds one unnamed array: the model's only input.
      if (arrays[k].name == in.name || (arrays[k].name.empty() && inputs_.size() == 1)) a = k;
    }
    if (a == arrays.size()) {
      if (info.kind == BlockKind::Npy) {
        fail_invalid(here + " is an .npy, which holds one array, but the model has " +
                     std::to_string(inputs_.size()) + " inputs; use an .npz keyed by input name");
      }
      std::string keys;
      for (const BlockArray& arr : arrays) keys += (keys.empty() ? "" : ", ") + quote(printable(arr.name));
      fail_invalid(here + " has no array for input " + quote(in.name) + "; it holds " + keys +
                   " (arrays are matched to model inputs by name)");
    }
    used[a] = true;
    const BlockArray& arr = arrays[a];
    if (in.dtype && *in.dtype != arr.dtype) {
      fail_invalid(here + ": input " + quote(in.name) + " is " + std::string(dtype_name(arr.dtype)) +
                   " but the model expects " + std::string(dtype_name(*in.dtype)) +
                   "; convert it (e.g. x.astype(numpy." + std::string(numpy_name(*in.dtype)) +
                   "))");
    }
    bool axis = !arr.shape.empty();
    if (in.shape) {
      const std::vector<Dim>& dims = *in.shape;
      axis = arr.shape.size() == dims.size();
      bool ok = axis || arr.shape.size() + 1 == dims.size();
      for (size_t d = 1; ok && d < dims.size(); ++d) {
        const int64_t have = arr.shape[axis ? d : d - 1];
        ok = !dims[d].value || *dims[d].value == have;
      }
      if (!ok) {
        fail_invalid(here + ": input " + quote(in.name) + " has shape " +
                     shape_to_string(arr.shape) + " but the model expects " + dims_string(dims));
      }
    } else if (!axis) {
      fail_invalid(here + ": input " + quote(in.name) + " is a scalar; samples lie along axis 0");
    }
    const int64_t n = axis ? arr.shape[0] : 1;
    if (rows && *rows != n) {
      fail_invalid(here + ": input " + quote(in.name) + " has " + std::to_string(n) +
                   " sample(s) but " + rows_from + " has " + std::to_string(*rows) +
                   "; give every input the same count along axis 0");
    }
    rows = n;
    rows_from = "input " + quote(in.name);
    info.input_array.push_back(a);
    info.sample_axis.push_back(axis);
    info.row_shapes.push_back(row_shape(arr, axis));
  }
  info.rows = *rows;
  const bool per_sample_file = !info.sample_axis.front();
  for (size_t k = 0; k < arrays.size(); ++k) {
    const BlockArray& arr = arrays[k];
    if (used[k] || arr.name.empty()) continue;
    const bool axis = !per_sample_file && !arr.shape.empty() && arr.shape[0] == info.rows;
    if (!axis && !per_sample_file) continue;  // not aligned with the samples: left alone
    info.extras[arr.name] = {k, axis, arr.dtype, row_shape(arr, axis)};
  }
}

bool Dataset::next(Feeds& batch, Feeds* extras) {
  Cursor& c = *cursor_;
  batch.clear();
  if (extras != nullptr) extras->clear();
  if (c.served >= size_) {
    if (c.hashing && digest_.empty()) digest_ = c.hasher.hex_digest();
    c.hashing = false;
    return false;
  }
  int64_t want = std::min(batch_, size_ - c.served);
  std::vector<std::vector<Tensor>> pieces(inputs_.size());
  std::vector<std::vector<Tensor>> extra_pieces(extra_names_.size());
  const std::vector<Shape>* batch_rows = nullptr;
  int64_t taken = 0;
  while (want > 0) {
    if (c.row == blocks_[c.block].rows) {
      ++c.block;
      c.row = 0;
      continue;
    }
    const BlockInfo& info = blocks_[c.block];
    if (batch_rows != nullptr && *batch_rows != info.row_shapes) {
      if (fixed_batch_) {
        fail_invalid(role_ + " " + quote(blocks_[c.block].path.string()) +
                     ": samples change shape inside a batch of the model's fixed size " +
                     std::to_string(batch_) + "; give samples of one shape");
      }
      break;  // a batch holds samples of one shape
    }
    batch_rows = &info.row_shapes;
    DataBlock& block = open_block(c.block);
    const int64_t take = std::min(want, info.rows - c.row);
    auto read = [&](size_t array, bool axis) {
      if (axis) return block.read(array, c.row, take);
      const BlockArray& arr = block.arrays()[array];
      const Tensor whole = block.read(array, 0, arr.shape.empty() ? 1 : arr.shape[0]);
      Shape shape = {1};
      shape.insert(shape.end(), arr.shape.begin(), arr.shape.end());
      return Tensor(whole.dtype(), std::move(shape), whole.storage(), whole.offset());
    };
    for (size_t i = 0; i < inputs_.size(); ++i) {
      pieces[i].push_back(read(info.input_array[i], info.sample_axis[i]));
    }
    if (extras != nullptr) {
      for (size_t e = 0; e < extra_names_.size(); ++e) {
        const BlockInfo::Extra& x = info.extras.at(extra_names_[e]);
        extra_pieces[e].push_back(read(x.array, x.sample_axis));
      }
    }
    c.row += take;
    want -= take;
    taken += take;
  }
  for (size_t i = 0; i < inputs_.size(); ++i) {
    batch.emplace_back(inputs_[i].name, concatenate(pieces[i]));
  }
  if (extras != nullptr) {
    for (size_t e = 0; e < extra_names_.size(); ++e) {
      extras->emplace_back(extra_names_[e], concatenate(extra_pieces[e]));
    }
  }
  if (c.hashing) {
    for (int64_t s = 0; s < taken; ++s) {
      for (const auto& [name, t] : batch) {
        const size_t row = t.nbytes() / static_cast<size_t>(taken);
        c.hasher.update(t.bytes().subspan(static_cast<size_t>(s) * row, row));
      }
    }
  }
  c.served += taken;
  return true;
}

void Dataset::rewind() {
  Cursor& c = *cursor_;
  c.block = 0;
  c.row = 0;
  c.served = 0;
  c.hasher.hex_digest();  // discards what was hashed
  c.hashing = true;
}

std::string Dataset::digest() {
  if (!digest_.empty()) return digest_;
  rewind();
  Feeds batch;
  while (next(batch)) {
  }
  rewind();
  return digest_;
}

}  // namespace qforge
