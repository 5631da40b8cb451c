#pragma once
// Progress of a long step (calibration, comparison) on stderr. On a terminal: one bar redrawn in
// place with the rate and the time left; otherwise (CI, a pipe, a file) a plain line at every
// tenth of the work, so logs stay readable. Nothing at all when disabled (-q).
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>

namespace qforge::cli {

class Progress {
 public:
  // `label` starts every line ("calibrate"); `unit` names what is counted ("samples").
  Progress(std::string label, std::string unit, bool enabled);
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // Reports `done` of `total`; safe to call from any thread, cheap to call often.
  void update(int64_t done, int64_t total);
  // Ends the bar (a newline on a terminal); called by the destructor if not before.
  void finish();

  // "1m05s", "12s", "2h03m".
  static std::string format_duration(double seconds);

 private:
  void draw_bar(int64_t done, int64_t total, double elapsed);
  void print_line(int64_t done, int64_t total, double elapsed);

  std::string label_;
  std::string unit_;
  bool enabled_;
  bool terminal_;
  bool drawn_ = false;
  bool finished_ = false;
  int last_tenth_ = -1;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_draw_;
  std::mutex mutex_;
};

}  // namespace qforge::cli
