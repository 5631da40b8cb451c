#pragma once
// Safetensors written tensor by tensor: each tensor's data goes to disk as it is added, so a
// caller can produce a large model's tensors one at a time and drop each once added (bounded
// memory). A shard's header needs every tensor of the shard, so its data is first written to a
// temporary file and the shard assembled (header, then the data copied in the kernel) when it
// closes, unless the caller gave room for the header (the constructor's header_reserve).
// Tensors keep the order they were added in, in the file and in the header's offsets.
// Names and sharding follow export_safetensors (safetensors_writer.h): one file `out`, or
// "STEM-0000N-of-0000M.safetensors" shards of at most max_shard_size data bytes (a larger tensor
// alone) with "out.index.json". Nothing is renamed into place before finish(); destroyed before,
// the writer removes what it wrote.
//
// The bytes go to disk on a thread of the writer's own, in the order added, so that the caller
// prepares the next tensor meanwhile; at most kMaxQueued bytes wait (add() blocks beyond), so
// memory stays bounded. A failed write is thrown by the next add() or by finish().
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <exception>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "exporters/atomic_file.h"
#include "ir/tensor.h"

namespace qforge {

class SafetensorsStreamWriter {
 public:
  // `metadata` is each file's `__metadata__`. max_shard_size 0: one file. header_reserve: an
  // upper bound on a shard's header in bytes (0: unknown). Given, the data is written after that
  // much room (rounded up to 4096) in the shard's own file, and a header that fits is written
  // into the room, padded with spaces; the data is then never copied. A header that does not
  // fit is written as when none is given.
  SafetensorsStreamWriter(std::filesystem::path out, uint64_t max_shard_size,
                          std::map<std::string, std::string> metadata,
                          uint64_t header_reserve = 0);
  ~SafetensorsStreamWriter();
  SafetensorsStreamWriter(const SafetensorsStreamWriter&) = delete;
  SafetensorsStreamWriter& operator=(const SafetensorsStreamWriter&) = delete;

  // Queues `tensor`'s bytes for writing, keeping a reference to its storage (which the caller
  // must not write to afterwards); its mapped pages are released once written
  // (ir/page_release.h). Throws InvalidInput for a repeated name, "__metadata__" or a tensor
  // without data, Internal for a 4-bit tensor (no safetensors dtype), IO when a file cannot be
  // written (this tensor's or an earlier one's).
  void add(const std::string& name, const Tensor& tensor);
  uint64_t data_bytes() const { return total_; }
  // Completes the last shard, renames every file into place, the index last.
  void finish();

 private:
  struct Entry {
    std::string name;
    DType dtype;
    Shape shape;
    uint64_t size;
  };
  struct Shard {
    std::vector<Entry> entries;
    uint64_t bytes = 0;
    std::filesystem::path assembled;  // the complete file, under a temporary name
  };
  static constexpr uint64_t kMaxQueued = uint64_t{256} << 20;

  void open_data();
  void close_shard();
  void write_loop();
  // Waits until every queued tensor is written; rethrows a write's failure.
  void drain();
  std::filesystem::path temp_name(const std::string& what) const;

  std::filesystem::path out_;
  uint64_t max_shard_size_;
  std::map<std::string, std::string> metadata_;
  uint64_t header_reserve_;  // a multiple of 4096, or 0
  std::vector<Shard> shards_;
  std::FILE* data_ = nullptr;
  std::filesystem::path data_path_;
  // The open data file's writeback, started as it is written (the folder's commit flushes it).
  std::optional<WritebackPacer> writeback_;
  std::vector<std::filesystem::path> temps_;  // removed unless finished
  std::set<std::string> names_;
  uint64_t total_ = 0;
  bool finished_ = false;

  // The writing thread's queue, under mutex_.
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Tensor> queue_;
  uint64_t queued_bytes_ = 0;
  bool writing_ = false;  // the thread holds a tensor taken off the queue
  bool stop_ = false;
  std::exception_ptr failure_;
  std::thread thread_;
};

}  // namespace qforge
