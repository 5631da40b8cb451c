#pragma once
// The HTML report (`--report out.html` on convert, calibrate and compare; `qforge report`): one
// self-contained file, readable offline. Charts are inline SVG (exporters/report/svg_chart.h),
// each followed by a table of the same numbers; the source data is embedded as JSON in a
// <script type="application/json" id="qforge-report-data"> block. No network, no fonts or
// scripts from elsewhere; one small inline script offers the data as a download. The same data
// gives the same bytes.
//
// Numbers in tables: the cell shows a rounded figure and carries the exact value in its
// data-v attribute (shortest text that reads back as the same double, "inf" for +inf).
#include <filesystem>
#include <string>

#include "exporters/report/report_data.h"

namespace qforge::report {

// Bars shown per error chart (the worst ones); the table under it lists every row.
inline constexpr size_t kMaxChartRows = 60;

std::string html_report(const ReportData& data);

// Writes html_report(data) to `path` atomically (exporters/atomic_file.h).
void write_html_report(const ReportData& data, const std::filesystem::path& path);

}  // namespace qforge::report
