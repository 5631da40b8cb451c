#include "exporters/safetensors/safetensors_stream_writer.h"

#include <fcntl.h>
#include <sys/sendfile.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include <nlohmann/json.hpp>

#include "exporters/atomic_file.h"
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
    const ssize_t n = ::write(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail_io("cannot write '" + path.string() + "': " + std::strerror(errno));
    p += n;
    size -= static_cast<size_t>(n);
  }
}

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

SafetensorsStreamWriter::SafetensorsStreamWriter(fs::path out, uint64_t max_shard_size,
                                                 std::map<std::string, std::string> metadata)
    : out_(std::move(out)), max_shard_size_(max_shard_size), metadata_(std::move(metadata)) {
  std::error_code ec;
  const fs::path parent = out_.parent_path().empty() ? fs::path(".") : out_.parent_path();
  if (!fs::is_directory(parent, ec)) {
    fail_io("output folder '" + parent.string() + "' does not exist: create it first");
  }
}

SafetensorsStreamWriter::~SafetensorsStreamWriter() {
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
  const auto bytes = tensor.bytes();
  if (size != 0 && std::fwrite(bytes.data(), 1, size, data_) != size) {
    fail_io("cannot write '" + data_path_.string() + "': " + std::strerror(errno) +
            " (disk full?)");
  }
  release_tensor_pages(tensor);
  shards_.back().entries.push_back({name, tensor.dtype(), tensor.shape(), size});
  shards_.back().bytes += size;
  total_ += size;
}

// Header (offsets in the order added, padded with spaces to 8 bytes), then the data file's
// bytes copied by the kernel into the assembled file.
void SafetensorsStreamWriter::close_shard() {
  if (data_ == nullptr) return;
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
  h.append((8 - h.size() % 8) % 8, ' ');

  shard.assembled = temp_name("shard" + std::to_string(shards_.size() - 1));
  temps_.push_back(shard.assembled);
  Fd out{::open(shard.assembled.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644)};
  if (out.fd < 0) {
    fail_io("cannot create '" + shard.assembled.string() + "': " + std::strerror(errno));
  }
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(h.size() >> (8 * i));
  write_all(out.fd, len, sizeof len, shard.assembled);
  write_all(out.fd, h.data(), h.size(), shard.assembled);
  Fd in{::open(data_path_.c_str(), O_RDONLY)};
  if (in.fd < 0) fail_io("cannot read '" + data_path_.string() + "': " + std::strerror(errno));
  uint64_t left = shard.bytes;
  while (left > 0) {
    const ssize_t n = ::sendfile(out.fd, in.fd, nullptr, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      fail_io("cannot write '" + shard.assembled.string() + "': " + std::strerror(errno) +
              " (disk full?)");
    }
    left -= static_cast<uint64_t>(n);
  }
  if (::close(out.fd) != 0) {
    out.fd = -1;
    fail_io("cannot write '" + shard.assembled.string() + "': " + std::strerror(errno));
  }
  out.fd = -1;
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
