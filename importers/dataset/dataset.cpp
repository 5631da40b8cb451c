#include "importers/dataset/dataset.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <optional>

#include "importers/dataset/block_layout.h"
#include "importers/dataset/data_block.h"
#include "ir/sha256.h"
#include "importers/torch/byte_io.h"
#include "ir/error.h"

namespace qforge {

using dataset_detail::BlockArray;
using dataset_detail::BlockKind;
using dataset_detail::BlockLayout;
using dataset_detail::DataBlock;
using torch_detail::printable;
using torch_detail::quote;

namespace {

// n for a folder named test_data_set_<n>.
std::optional<int64_t> test_set_number(const std::string& name) {
  constexpr std::string_view kPrefix = "test_data_set_";
  if (name.size() <= kPrefix.size() || name.compare(0, kPrefix.size(), kPrefix) != 0) return {};
  int64_t n = 0;
  const auto [end, ec] =
      std::from_chars(name.data() + kPrefix.size(), name.data() + name.size(), n);
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

// NaN and Inf values per sample (row along axis 0) of a float tensor; none for other dtypes.
std::vector<int64_t> nonfinite_per_row(const Tensor& t) {
  if (!dtype_is_float(t.dtype()) || t.rank() == 0) return {};
  const auto rows = static_cast<size_t>(t.shape()[0]);
  std::vector<int64_t> counts(rows, 0);
  if (rows == 0) return counts;
  const size_t per_row = t.numel() / rows;
  auto count = [&](auto value_at) {
    for (size_t r = 0; r < rows; ++r) {
      for (size_t k = r * per_row; k < (r + 1) * per_row; ++k) {
        counts[r] += std::isfinite(value_at(k)) ? 0 : 1;
      }
    }
  };
  if (t.dtype() == DType::F32) {
    const std::byte* bytes = t.bytes().data();  // a file window: may not be aligned for float
    count([bytes](size_t k) {
      float v;
      std::memcpy(&v, bytes + k * sizeof(float), sizeof(float));
      return v;
    });
  } else {
    const std::vector<float> values = t.to_f32();
    count([&values](size_t k) { return values[k]; });
  }
  return counts;
}

}  // namespace

struct Dataset::BlockInfo : dataset_detail::BlockLayout {
  std::filesystem::path path;
  BlockKind kind = BlockKind::Npz;
};

struct Dataset::Cursor {
  size_t block = 0;
  int64_t row = 0;
  int64_t served = 0;
  size_t open_index = SIZE_MAX;
  int64_t block_start = 0;  // data-set index of the block's first row
  size_t drop = 0;  // dropped_[drop] is the next dropped sample at or after the cursor
  std::unique_ptr<DataBlock> open;
  Sha256 hasher;
  bool hashing = true;  // every sample of this pass so far went into the hasher
};

Dataset::Dataset(const std::filesystem::path& path, std::vector<ValueInfo> inputs,
                 int64_t calib_size, int64_t batch, std::string_view role,
                 BadSamples bad_samples)
    : inputs_(std::move(inputs)),
      role_(role),
      source_(path.string()),
      bad_samples_(bad_samples),
      cursor_(std::make_unique<Cursor>()) {
  if (calib_size < 0) {
    fail_usage("calibration size " + std::to_string(calib_size) + ": use 0 (all) or a count");
  }
  if (batch < 1) fail_usage("batch " + std::to_string(batch) + ": use 1 or more samples");
  if (inputs_.empty()) fail_unsupported("the model has no inputs to feed from " + quote(source_));
  batch_ = batch;
  for (const ValueInfo& in : inputs_) {
    if (in.shape && in.shape->empty()) {
      fail_unsupported("model input " + quote(in.name) +
                       " is a scalar; data sets feed samples "
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
  if (bad_samples_ == BadSamples::Drop) find_bad_samples(calib_size);
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
      fail_unsupported(role_ + " " + quote(source_) +
                       " is neither .npz nor .npy; give an .npz, "
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
      fail_invalid(role_ + " folder " + quote(source_) +
                   " holds no .npz or .npy files and no "
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
    DataBlock& block = open_block(i);
    static_cast<BlockLayout&>(blocks_[i]) =
        match_inputs(block, inputs_, where(block), blocks_[i].kind == BlockKind::Npy);
    available_ += blocks_[i].rows;
  }
  if (available_ == 0) fail_invalid(role_ + " " + quote(source_) + " holds no samples");
  // Extras every block holds alike.
  for (const auto& entry : blocks_.front().extras) {
    const bool everywhere = std::all_of(blocks_.begin(), blocks_.end(), [&](const BlockInfo& b) {
      const auto it = b.extras.find(entry.first);
      return it != b.extras.end() && it->second == entry.second;
    });
    if (everywhere) extra_names_.push_back(entry.first);
  }
}

DataBlock& Dataset::open_block(size_t index) {
  Cursor& c = *cursor_;
  if (c.open_index != index) {
    c.open.reset();  // one block open at a time
    c.open_index = SIZE_MAX;
    const BlockInfo& b = blocks_[index];
    switch (b.kind) {
      case BlockKind::Npz:
        c.open = dataset_detail::open_npz_block(b.path);
        break;
      case BlockKind::Npy:
        c.open = dataset_detail::open_npy_block(b.path);
        break;
      case BlockKind::Pb:
        c.open = dataset_detail::open_pb_block(b.path, inputs_);
        break;
    }
    c.open_index = index;
  }
  return *c.open;
}

void Dataset::find_bad_samples(int64_t calib_size) {
  const int64_t wanted = calib_size == 0 ? available_ : std::min(calib_size, available_);
  size_ = available_;
  int64_t seen = 0, kept = 0;
  Feeds batch;
  rewind();
  while (kept < wanted && read_batch(batch, nullptr)) {
    std::vector<bool> bad(static_cast<size_t>(batch.front().second.shape()[0]), false);
    for (const auto& [name, t] : batch) {
      const std::vector<int64_t> counts = nonfinite_per_row(t);
      for (size_t r = 0; r < counts.size(); ++r) bad[r] = bad[r] || counts[r] > 0;
    }
    for (size_t r = 0; r < bad.size() && kept < wanted; ++r) {
      if (bad[r]) {
        dropped_.push_back(seen + static_cast<int64_t>(r));
      } else {
        ++kept;
      }
    }
    seen += static_cast<int64_t>(bad.size());
  }
  rewind();
  digest_.clear();  // that pass hashed the dropped samples too
  size_ = kept;
  if (kept == 0) {
    fail_invalid(role_ + " " + quote(source_) + ": all " + std::to_string(dropped_.size()) +
                 " sample(s) hold NaN or Inf in a float input; none is left after "
                 "--drop-bad-samples");
  }
  if (!dropped_.empty()) {
    spdlog::warn("{} {}: dropped {} sample(s) holding NaN or Inf in a float input; {} kept",
                 role_, quote(source_), dropped_.size(), kept);
  }
}

std::vector<int64_t> Dataset::bad_rows(const Feeds& batch, size_t* input) const {
  std::vector<int64_t> rows;
  std::vector<std::vector<int64_t>> counts;
  for (const auto& [name, t] : batch) counts.push_back(nonfinite_per_row(t));
  const int64_t n = batch.front().second.shape()[0];
  for (int64_t r = 0; r < n; ++r) {
    for (size_t i = 0; i < counts.size(); ++i) {
      if (counts[i].empty() || counts[i][static_cast<size_t>(r)] == 0) continue;
      if (rows.empty()) *input = i;
      rows.push_back(r);
      break;
    }
  }
  return rows;
}

void Dataset::refuse_bad_sample(int64_t first_bad, size_t input) {
  // Error path: one more pass counts what the rest of the data set holds.
  int64_t values = 0, samples = 0;
  Feeds batch;
  rewind();
  while (read_batch(batch, nullptr)) {
    for (const int64_t n : nonfinite_per_row(batch[input].second)) {
      values += n;
      samples += n > 0 ? 1 : 0;
    }
  }
  rewind();
  const auto [block, row] = locate(first_bad);
  const bool folder = blocks_.size() > 1;
  fail_invalid(role_ + " " + quote(blocks_[block].path.string()) + ": input " +
               quote(inputs_[input].name) + " holds " + std::to_string(values) +
               " NaN or Inf value(s) in " + std::to_string(samples) + " of " +
               std::to_string(size_) + " samples" + (folder ? " of " + quote(source_) : "") +
               ", the first at sample " + std::to_string(row) + (folder ? " of this file" : "") +
               "; fix the data, or pass --drop-bad-samples to skip such samples");
}

std::pair<size_t, int64_t> Dataset::locate(int64_t index) const {
  for (size_t b = 0; b < blocks_.size(); ++b) {
    if (index < blocks_[b].rows) return {b, index};
    index -= blocks_[b].rows;
  }
  return {blocks_.size() - 1, blocks_.back().rows};  // past the end: not a sample of the set
}

std::string Dataset::sample_origin(int64_t sample) const {
  int64_t index = sample;  // served -> data-set order: step over the dropped ones before it
  for (const int64_t d : dropped_) {
    if (d > index) break;
    ++index;
  }
  const auto [block, row] = locate(index);
  if (blocks_.size() == 1) return role_ + " " + quote(source_) + " sample " + std::to_string(row);
  return role_ + " " + quote(blocks_[block].path.string()) + " sample " + std::to_string(row) +
         " (sample " + std::to_string(index) + " of " + quote(source_) + ")";
}

bool Dataset::next(Feeds& batch, Feeds* extras) {
  const int64_t first = cursor_->served;
  if (!read_batch(batch, extras)) return false;
  if (bad_samples_ == BadSamples::Refuse) {
    size_t input = 0;
    const std::vector<int64_t> bad = bad_rows(batch, &input);
    if (!bad.empty()) refuse_bad_sample(first + bad.front(), input);
  }
  return true;
}

bool Dataset::read_batch(Feeds& batch, Feeds* extras) {
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
      c.block_start += blocks_[c.block].rows;
      ++c.block;
      c.row = 0;
      continue;
    }
    const BlockInfo& info = blocks_[c.block];
    // Dropped samples are stepped over; a batch takes rows up to the next one.
    const int64_t at = c.block_start + c.row;
    while (c.drop < dropped_.size() && dropped_[c.drop] < at) ++c.drop;
    if (c.drop < dropped_.size() && dropped_[c.drop] == at) {
      ++c.row;
      continue;
    }
    const int64_t before_drop =
        c.drop < dropped_.size() ? dropped_[c.drop] - at : std::numeric_limits<int64_t>::max();
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
    const int64_t take = std::min({want, info.rows - c.row, before_drop});
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
        const BlockLayout::Extra& x = info.extras.at(extra_names_[e]);
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
  if (c.hashing && digest_.empty()) {  // once known, later passes need not hash again
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
  c.block_start = 0;
  c.drop = 0;
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
