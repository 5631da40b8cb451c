#include "cli/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace qforge::cli {

namespace {

constexpr int kBarWidth = 30;
constexpr auto kRedrawEvery = std::chrono::milliseconds(100);

std::string rate_text(int64_t done, double elapsed, const std::string& unit) {
  char buf[64];
  const double rate = elapsed > 0.0 ? static_cast<double>(done) / elapsed : 0.0;
  std::snprintf(buf, sizeof buf, "%.1f %s/s", rate, unit.c_str());
  return buf;
}

std::string eta_text(int64_t done, int64_t total, double elapsed) {
  if (done <= 0 || elapsed <= 0.0) return "ETA ?";
  const double left = elapsed * static_cast<double>(total - done) / static_cast<double>(done);
  return "ETA " + Progress::format_duration(left);
}

}  // namespace

Progress::Progress(std::string label, std::string unit, bool enabled)
    : label_(std::move(label)),
      unit_(std::move(unit)),
      enabled_(enabled),
      terminal_(isatty(fileno(stderr)) != 0),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_ - kRedrawEvery) {}

Progress::~Progress() { finish(); }

std::string Progress::format_duration(double seconds) {
  const auto s = static_cast<int64_t>(std::llround(std::max(0.0, seconds)));
  char buf[32];
  if (s < 60) {
    std::snprintf(buf, sizeof buf, "%llds", static_cast<long long>(s));
  } else if (s < 3600) {
    std::snprintf(buf, sizeof buf, "%lldm%02llds", static_cast<long long>(s / 60),
                  static_cast<long long>(s % 60));
  } else {
    std::snprintf(buf, sizeof buf, "%lldh%02lldm", static_cast<long long>(s / 3600),
                  static_cast<long long>((s % 3600) / 60));
  }
  return buf;
}

void Progress::update(int64_t done, int64_t total) {
  if (!enabled_ || total <= 0) return;
  const std::lock_guard<std::mutex> lock(mutex_);
  if (finished_) return;
  const auto now = std::chrono::steady_clock::now();
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  if (terminal_) {
    if (now - last_draw_ < kRedrawEvery && done < total) return;
    last_draw_ = now;
    draw_bar(done, total, elapsed);
    return;
  }
  const int tenth = static_cast<int>(std::min<int64_t>(10, done * 10 / total));
  if (tenth <= last_tenth_) return;
  last_tenth_ = tenth;
  print_line(done, total, elapsed);
}

void Progress::finish() {
  const std::lock_guard<std::mutex> lock(mutex_);
  if (finished_) return;
  finished_ = true;
  if (enabled_ && terminal_ && drawn_) std::fputc('\n', stderr);
}

void Progress::draw_bar(int64_t done, int64_t total, double elapsed) {
  const auto filled = static_cast<int>(kBarWidth * std::min(done, total) / total);
  std::string bar(static_cast<size_t>(filled), '#');
  bar.resize(kBarWidth, '.');
  // \r and clear-to-end-of-line so a shorter line leaves no trail.
  std::fprintf(stderr, "\r%s [%s] %lld/%lld %s  %s  %s\x1b[K", label_.c_str(), bar.c_str(),
               static_cast<long long>(done), static_cast<long long>(total), unit_.c_str(),
               rate_text(done, elapsed, unit_).c_str(), eta_text(done, total, elapsed).c_str());
  std::fflush(stderr);
  drawn_ = true;
}

void Progress::print_line(int64_t done, int64_t total, double elapsed) {
  std::fprintf(stderr, "%s: %lld/%lld %s (%lld%%), %s, %s\n", label_.c_str(),
               static_cast<long long>(done), static_cast<long long>(total), unit_.c_str(),
               static_cast<long long>(done * 100 / total), rate_text(done, elapsed, unit_).c_str(),
               eta_text(done, total, elapsed).c_str());
  std::fflush(stderr);
}

}  // namespace qforge::cli
