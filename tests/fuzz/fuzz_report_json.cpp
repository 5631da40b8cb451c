// Fuzzes the HTML report's reader and writer (exporters/report/): any JSON text is either
// refused (not JSON, or a qforge::Error naming the value) or drawn into a page whose data block
// reads back as the document and that no name can break out of: exactly two <script> elements,
// each closed once; never a crash or a read outside the input.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "exporters/report/html_report.h"
#include "exporters/report/report_data.h"
#include "ir/error.h"

#include "abort_on_internal.h"

namespace {

void check(bool ok) {
  if (!ok) std::abort();  // libFuzzer reports the input that got here
}

size_t count(const std::string& text, std::string_view what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using qforge::report::Json;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const Json doc = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return 0;
  qforge::report::ReportData report;
  try {
    report = qforge::report::report_data_from_json(doc, "fuzz");
  } catch (const qforge::Error& e) {
    qforge::fuzz::abort_on_internal(e);
    return 0;
  }
  const std::string html = qforge::report::html_report(report);
  check(count(html, "<script") == 2 && count(html, "</script") == 2);
  check(count(html, "<!--") == 0);
  const size_t open = html.find("id=\"qforge-report-data\">");
  check(open != std::string::npos);
  const size_t begin = open + std::string_view("id=\"qforge-report-data\">").size();
  const size_t end = html.find("</script>", begin);
  const Json back = Json::parse(html.substr(begin, end - begin), nullptr, false);
  check(!back.is_discarded());
  check(html == qforge::report::html_report(report));  // the same data, the same bytes
  return 0;
}
