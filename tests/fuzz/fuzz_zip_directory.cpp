// Fuzzes the zip directory parser torch archives go through: any input either parses into
// entries whose data lies inside the input, with unique relative names, or is refused with a
// qforge::Error; never a crash, a read outside the input, or an unbounded allocation.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "importers/torch/zip_reader.h"
#include "ir/error.h"

#include "abort_on_internal.h"

namespace {

void check(bool ok) {
  if (!ok) std::abort();  // libFuzzer reports the input that got here
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  try {
    const auto dir = qforge::ZipDirectory::parse(bytes, "fuzz.zip");
    for (const auto& entry : dir.entries()) {
      check(dir.find(entry.name) == &entry);
      check(!entry.name.empty() && entry.name.front() != '/');
      try {
        const auto body = dir.data(bytes, entry, "fuzz.zip");
        check(body.data() >= bytes.data() && body.data() + body.size() <= bytes.data() + size);
        unsigned sum = 0;
        for (const std::byte b : body) sum += static_cast<unsigned>(b);  // ASan checks each read
        check(sum <= 255u * body.size());
      } catch (const qforge::Error& e) {
        qforge::fuzz::abort_on_internal(e);
        check(entry.method != 0 || (entry.flags & 1u) != 0);  // only compressed/encrypted fail
      }
    }
  } catch (const qforge::Error& e) {
    qforge::fuzz::abort_on_internal(e);
  }
  return 0;
}
