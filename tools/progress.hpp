// A progress line for the long-running tools (arcpool-stress, arcpool-replay): operations done,
// their rate and the time left, redrawn in place on standard error at most four times a
// second. Silent when standard error is not a terminal, so logs, pipes and CI output stay as
// they were.
#pragma once

#include <unistd.h>

#include <chrono>
#include <cinttypes>
#include <cstdint>
#include <cstdio>

namespace arcpool::tools {

/// One tool's progress line on standard error, when that is a terminal.
class progress {
 public:
  /// `label` starts the line ("arcpool-stress"); `unit` names what is counted ("operations").
  progress(const char* label, const char* unit)
      : label_(label), unit_(unit), shown_(isatty(STDERR_FILENO) == 1) {}
  progress(const progress&) = delete;
  progress& operator=(const progress&) = delete;
  ~progress() { finish(); }

  /// Whether the line is drawn (standard error is a terminal).
  bool shown() const { return shown_; }

  /// Redraws the line with `done` operations so far, `fraction` (0 to 1) of the run done, which
  /// gives the time left. Calls within 250 ms of the start or of the last drawing draw nothing
  /// (a short run draws no line).
  void update(uint64_t done, double fraction) {
    if (!shown_) return;
    const auto now = clock::now();
    if (now - (drawn_ ? last_ : start_) < std::chrono::milliseconds(250)) return;
    last_ = now;
    drawn_ = true;
    const double elapsed = std::chrono::duration<double>(now - start_).count();
    const double rate = elapsed > 0 ? done / elapsed : 0;
    const double left = fraction > 0 && fraction < 1 ? elapsed * (1 - fraction) / fraction : 0;
    std::fprintf(stderr, "\r%s: %" PRIu64 " %s, %.0f/s, %.0f s left   ", label_, done, unit_, rate,
                 left);
    std::fflush(stderr);
  }

  /// Clears the line (once the run is over, before the tool prints its results).
  void finish() {
    if (!drawn_) return;
    std::fprintf(stderr, "\r\033[K");
    std::fflush(stderr);
    drawn_ = false;
  }

 private:
  using clock = std::chrono::steady_clock;
  const char* label_;
  const char* unit_;
  const bool shown_;
  bool drawn_ = false;
  clock::time_point start_ = clock::now();
  clock::time_point last_;
};

}  // namespace arcpool::tools
