// Fuzzes the calibration table readers (qforge JSON and TensorRT cache): any input is either
// refused with a qforge::Error or parsed into a table whose JSON form reads back identically;
// never a crash, a read outside the input, or an unbounded allocation.
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "exporters/calib_table_writer.h"
#include "importers/calib_table_reader.h"
#include "ir/error.h"

#include "abort_on_internal.h"

namespace {

void check(bool ok) {
  if (!ok) std::abort();  // libFuzzer reports the input that got here
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  qforge::CalibrationTable table;
  try {
    table = qforge::parse_calibration_table(text, "fuzz");
  } catch (const qforge::Error& e) {
    qforge::fuzz::abort_on_internal(e);
    return 0;
  }
  for (const auto& [name, r] : table.ranges) check(!name.empty() && r.amax >= 0 && r.min <= r.max);
  std::string json;
  try {
    json = qforge::calibration_table_json(table);
  } catch (const qforge::Error& e) {
    qforge::fuzz::abort_on_internal(e);
    return 0;  // a name that is not UTF-8 (from a cache) has no JSON form
  }
  const qforge::CalibrationTable back = qforge::parse_calibration_json(json, "fuzz round trip");
  check(back.method == table.method && back.samples == table.samples &&
        back.dataset_digest == table.dataset_digest && back.ranges.size() == table.ranges.size());
  for (auto a = table.ranges.cbegin(), b = back.ranges.cbegin(); a != table.ranges.cend();
       ++a, ++b) {
    check(a->first == b->first);
    check(std::bit_cast<uint32_t>(a->second.amax) == std::bit_cast<uint32_t>(b->second.amax));
    check(std::bit_cast<uint32_t>(a->second.min) == std::bit_cast<uint32_t>(b->second.min));
    check(std::bit_cast<uint32_t>(a->second.max) == std::bit_cast<uint32_t>(b->second.max));
  }
  try {
    (void)qforge::tensorrt_calibration_cache(table);
  } catch (const qforge::Error& e) {
    qforge::fuzz::abort_on_internal(e);
    // names with line breaks (from JSON) have no cache form
  }
  return 0;
}
