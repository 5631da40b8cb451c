#include "exporters/safetensors/safetensors_stream_writer.h"

#include <fcntl.h>
#include <sys/sendfile.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include <nlohmann/json.hpp>

#include "exporters/atomic_file.h"
#include "exporters/write_pieces.h"
#include "ir/error.h"
#include "ir/page_release.h"

namespace qforge {

namespace {

namespace fs = std::filesystem;

std::string_view stored_dtype(DType dtype) {
  switch (dtype) {
    case DType::I64: return "I64";
    case DType::F64: return "F64";
    case DType::F32: return "F32";
    case DType::I32: return "I32";
    case DType::BF16: return "BF16";
    case DType::F16: return "F16";
    case DType::I16: return "I16";
    case DType::I8: return "I8";
    case DType::U8: return "U8";
    case DType::Bool: return "BOOL";
    case DType::I4:
    case DType::U4: break;
  }
  fail_internal("safetensors stream writer: no safetensors dtype for " +
                std::string(dtype_name(dtype)));
}

std::string quoted(const std::string& s) {
  try {
    return nlohmann::json(s).dump();
  } catch (const nlohmann::json::type_error&) {
    fail_invalid("cannot write safetensors: '" + s + "' is not valid UTF-8; rename it");
  }
}

std::string shard_name(const fs::path& out, size_t index, size_t count) {
  char numbers[32];
  std::snprintf(numbers, sizeof numbers, "-%05zu-of-%05zu", index + 1, count);
  return out.stem().string() + numbers + out.extension().string();
}

void write_all(int fd, const void* data, size_t size, const fs::path& path) {
  const auto* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd, p, std::min(size, kWritePiece));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail_io("cannot write '" + path.string() + "': " + std::strerror(errno));
    p += n;
    size -= static_cast<size_t>(n);
  }
}

void pwrite_all(int fd, const void* data, size_t size, off_t at, const fs::path& path) {
  const auto* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::pwrite(fd, p, std::min(size, kWritePiece), at);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail_io("cannot write '" + path.string() + "': " + std::strerror(errno));
    p += n;
    at += n;
    size -= static_cast<size_t>(n);
  }
}

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  // Closes now; a failed close (delayed write errors) throws IO naming `path`.
  void close_or_fail(const fs::path& path) {
    const int result = ::close(fd);
    fd = -1;
    if (result != 0) fail_io("cannot write '" + path.string() + "': " + std::strerror(errno));
  }
};

}  // namespace

SafetensorsStreamWriter::SafetensorsStreamWriter(fs::path out, uint64_t max_shard_size,
                                                 std::map<std::string, std::string> metadata,
                                                 uint64_t header_reserve)
    : out_(std::move(out)),
      max_shard_size_(max_shard_size),
      metadata_(std::move(metadata)),
      header_reserve_(header_reserve == 0 ? 0 : (header_reserve + 4095) / 4096 * 4096) {
  if (header_reserve_ > (uint64_t{1} << 30)) {
    fail_internal("safetensors stream writer: header room of " + std::to_string(header_reserve_) +
                  " bytes");
  }
  std::error_code ec;
  const fs::path parent = out_.parent_path().empty() ? fs::path(".") : out_.parent_path();
  if (!fs::is_directory(parent, ec)) {
    fail_io("output folder '" + parent.string() + "' does not exist: create it first");
  }
  thread_ = std::thread([this] { write_loop(); });
}

SafetensorsStreamWriter::~SafetensorsStreamWriter() {
  {
    const std::lock_guard lock(mutex_);
    stop_ = true;
    queue_.clear();  // not finished: what waits is not wanted
  }
  changed_.notify_all();
  thread_.join();
  if (data_ != nullptr) std::fclose(data_);
  if (finished_) return;
  std::error_code ec;
  for (const auto& t : temps_) fs::remove(t, ec);
}

fs::path SafetensorsStreamWriter::temp_name(const std::string& what) const {
  std::string name = ".";
  name += out_.filename().string();
  name += '.';
  name += what;
  name += ".tmp-";
  name += std::to_string(::getpid());
  return out_.parent_path() / name;
}

void SafetensorsStreamWriter::open_data() {
  data_path_ = temp_name("data" + std::to_string(shards_.size()));
  temps_.push_back(data_path_);
  data_ = std::fopen(data_path_.c_str(), "wb");
  if (data_ == nullptr) {
    fail_io("cannot create '" + data_path_.string() + "': " + std::strerror(errno));
  }
  writeback_.emplace(data_path_);
  // Room for the header in front: the data goes after it, and the header is written over the
  // room when the shard closes (if it fits).
  if (header_reserve_ > 0 &&
      std::fseek(data_, static_cast<long>(header_reserve_), SEEK_SET) != 0) {
    fail_io("cannot write '" + data_path_.string() + "': " + std::strerror(errno));
  }
  shards_.emplace_back();
}

void SafetensorsStreamWriter::add(const std::string& name, const Tensor& tensor) {
  if (finished_) fail_internal("SafetensorsStreamWriter::add after finish");
  if (name == "__metadata__") {
    fail_invalid("cannot write '" + out_.string() + "': a tensor named '__metadata__' clashes "
                 "with the header's metadata entry; rename it");
  }
  if (tensor.empty()) {
    fail_invalid("cannot write '" + out_.string() + "': tensor '" + name + "' has no data");
  }
  if (!names_.insert(name).second) {
    fail_invalid("cannot write '" + out_.string() + "': tensor '" + name + "' given twice");
  }
  stored_dtype(tensor.dtype());  // refuses 4-bit tensors before anything is written
  const uint64_t size = tensor.nbytes();
  const bool full = max_shard_size_ != 0 && !shards_.empty() && !shards_.back().entries.empty() &&
                    shards_.back().bytes + size > max_shard_size_;
  if (full) close_shard();
  if (data_ == nullptr) open_data();
  {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] {
      return failure_ || queue_.empty() || queued_bytes_ + size <= kMaxQueued;
    });
    if (failure_) std::rethrow_exception(failure_);
    queue_.push_back(tensor);
    queued_bytes_ += size;
  }
  changed_.notify_all();
  shards_.back().entries.push_back({name, tensor.dtype(), tensor.shape(), size});
  shards_.back().bytes += size;
  total_ += size;
}

// The writing thread: the queue's tensors, in order, into the open data file (data_ changes only
// in drained states: open_data and close_shard run after drain()).
void SafetensorsStreamWriter::write_loop() {
  std::unique_lock lock(mutex_);
  for (;;) {
    changed_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stop_
    Tensor tensor = std::move(queue_.front());
    queue_.pop_front();
    writing_ = true;
    const bool failed = static_cast<bool>(failure_);
    lock.unlock();
    std::exception_ptr error;
    if (!failed) {
      try {
        const auto bytes = tensor.bytes();
        if (!fwrite_pieces(data_, bytes.data(), bytes.size())) {
          fail_io("cannot write '" + data_path_.string() + "': " + std::strerror(errno) +
                  " (disk full?)");
        }
        writeback_->wrote(bytes.size());
        release_tensor_pages(tensor);
      } catch (...) {
        error = std::current_exception();
      }
    }
    const uint64_t size = tensor.nbytes();
    tensor = Tensor();
    lock.lock();
    if (error && !failure_) failure_ = error;
    queued_bytes_ -= size;
    writing_ = false;
    changed_.notify_all();
  }
}

void SafetensorsStreamWriter::drain() {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return queue_.empty() && !writing_; });
  if (failure_) std::rethrow_exception(failure_);
}

// Header (offsets in the order added). With room reserved and enough of it, written over the
// room in front of the data (padded with spaces to fill it); otherwise padded to 8 bytes and
// followed by the data file's bytes, copied by the kernel into the assembled file.
void SafetensorsStreamWriter::close_shard() {
  if (data_ == nullptr) return;
  drain();
  writeback_.reset();
  if (std::fclose(data_) != 0) {
    data_ = nullptr;
    fail_io("cannot write '" + data_path_.string() + "': " + std::strerror(errno));
  }
  data_ = nullptr;
  Shard& shard = shards_.back();
  std::string h = "{";
  if (!metadata_.empty()) {
    h += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [key, value] : metadata_) {
      if (!first) h += ',';
      first = false;
      h += quoted(key);
      h += ':';
      h += quoted(value);
    }
    h += '}';
  }
  uint64_t offset = 0;
  for (const Entry& e : shard.entries) {
    if (h.size() > 1) h += ',';
    h += quoted(e.name);
    h += R"(:{"dtype":")";
    h += stored_dtype(e.dtype);
    h += R"(","shape":[)";
    for (size_t i = 0; i < e.shape.size(); ++i) {
      if (i) h += ',';
      h += std::to_string(e.shape[i]);
    }
    h += R"(],"data_offsets":[)";
    h += std::to_string(offset);
    h += ',';
    h += std::to_string(offset + e.size);
    h += "]}";
    offset += e.size;
  }
  h += '}';
  const bool in_place = header_reserve_ > 0 && 8 + h.size() <= header_reserve_;
  h.append(in_place ? header_reserve_ - 8 - h.size() : (8 - h.size() % 8) % 8, ' ');
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(h.size() >> (8 * i));
  if (in_place) {
    Fd fd{::open(data_path_.c_str(), O_WRONLY)};
    if (fd.fd < 0) fail_io("cannot write '" + data_path_.string() + "': " + std::strerror(errno));
    pwrite_all(fd.fd, len, sizeof len, 0, data_path_);
    pwrite_all(fd.fd, h.data(), h.size(), sizeof len, data_path_);
    fd.close_or_fail(data_path_);
    shard.assembled = data_path_;
    return;
  }

  shard.assembled = temp_name("shard" + std::to_string(shards_.size() - 1));
  temps_.push_back(shard.assembled);
  Fd out{::open(shard.assembled.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644)};
  if (out.fd < 0) {
    fail_io("cannot create '" + shard.assembled.string() + "': " + std::strerror(errno));
  }
  write_all(out.fd, len, sizeof len, shard.assembled);
  write_all(out.fd, h.data(), h.size(), shard.assembled);
  Fd in{::open(data_path_.c_str(), O_RDONLY)};
  if (in.fd < 0) fail_io("cannot read '" + data_path_.string() + "': " + std::strerror(errno));
  uint64_t left = shard.bytes;
  auto from = static_cast<off_t>(header_reserve_);  // the data's start in the data file
  while (left > 0) {
    const ssize_t n = ::sendfile(out.fd, in.fd, &from, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      fail_io("cannot write '" + shard.assembled.string() + "': " + std::strerror(errno) +
              " (disk full?)");
    }
    left -= static_cast<uint64_t>(n);
  }
  out.close_or_fail(shard.assembled);
  std::error_code ec;
  fs::remove(data_path_, ec);
}

void SafetensorsStreamWriter::finish() {
  if (finished_) return;
  if (shards_.empty()) open_data();  // no tensor: one file with an empty header
  close_shard();
  auto place = [](const fs::path& from, const fs::path& to) {
    std::error_code ec;
    fs::rename(from, to, ec);
    if (ec) fail_io("cannot rename '" + from.string() + "' to '" + to.string() + "': " +
                    ec.message());
  };
  if (shards_.size() == 1) {
    place(shards_[0].assembled, out_);
    finished_ = true;
    return;
  }
  nlohmann::json weight_map = nlohmann::json::object();
  for (size_t i = 0; i < shards_.size(); ++i) {
    const std::string file = shard_name(out_, i, shards_.size());
    for (const Entry& e : shards_[i].entries) weight_map[e.name] = file;
  }
  const nlohmann::json index = {{"metadata", {{"total_size", total_}}},
                                {"weight_map", std::move(weight_map)}};
  AtomicFile file(out_.string() + ".index.json");
  {
    const std::string text = index.dump(2, ' ', /*ensure_ascii=*/true) + "\n";
    Fd fd{::open(file.temp_path().c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644)};
    if (fd.fd < 0) fail_io("cannot create '" + file.temp_path().string() + "'");
    write_all(fd.fd, text.data(), text.size(), file.temp_path());
  }
  for (size_t i = 0; i < shards_.size(); ++i) {
    place(shards_[i].assembled, out_.parent_path() / shard_name(out_, i, shards_.size()));
  }
  file.commit();
  finished_ = true;
}

}  // namespace qforge
