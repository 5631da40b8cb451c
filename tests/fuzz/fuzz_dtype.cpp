// Fuzzes the dtype table's lookups and the overflow-checked storage size that every reader
// uses before it allocates: names and ONNX codes round-trip, and a size is either exact or
// refused, never wrapped.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string_view>

#include "ir/dtype.h"

namespace {

void check(bool ok) {
  if (!ok) std::abort();  // libFuzzer reports the input that got here
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1 + sizeof(uint64_t)) return 0;
  const int onnx_type = static_cast<int8_t>(data[0]);
  uint64_t count = 0;
  std::memcpy(&count, data + 1, sizeof(count));
  const std::string_view name(reinterpret_cast<const char*>(data) + 9, size - 9);

  if (const auto dtype = qforge::dtype_from_name(name)) {
    check(qforge::dtype_name(*dtype) == name);
  }
  const auto dtype = qforge::dtype_from_onnx(onnx_type);
  if (!dtype) return 0;
  check(qforge::dtype_to_onnx(*dtype) == onnx_type);

  const unsigned __int128 exact =
      (static_cast<unsigned __int128>(count) * qforge::dtype_bits(*dtype) + 7) / 8;
  const auto bytes = qforge::dtype_storage_bytes(*dtype, count);
  if (exact > std::numeric_limits<size_t>::max()) {
    check(!bytes.has_value());
  } else {
    check(bytes.has_value() && *bytes == static_cast<size_t>(exact));
  }
  return 0;
}
