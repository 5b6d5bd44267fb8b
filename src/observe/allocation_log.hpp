// The allocation log: one CSV row per allocate / free in RMM's columns
// (Thread,Time,Action,Pointer,Size,Stream), so that RMM's logs and arcpool's replay in one tool
// (tools/arcpool-replay) and RMM's replay benchmark reads arcpool's (design.md §11).
#pragma once

#include <atomic>
#include <cstdio>
#include <mutex>
#include <string>

#include "arcpool/arcpool.h"

namespace arcpool::detail {

/// The log file of the `n`-th allocator that ARCPOOL_LOG=`path` opened in this process: `path`
/// itself for the first, then "trace.1.csv", "trace.2.csv"... (the number before the extension),
/// so that several allocators never write one file through separate offsets.
std::string numbered_log_path(const std::string& path, unsigned n);

class allocation_log {
 public:
  ~allocation_log() { close(); }

  /// Starts writing to `path` (truncating it), header first. Replaces an open log.
  arcpool_status_t open(const char* path);
  /// Stops writing and closes the file. No-op when closed.
  void close() noexcept;
  /// True while a log is open (one relaxed load: the cost when logging is off).
  bool enabled() const noexcept { return file_.load(std::memory_order_relaxed) != nullptr; }

  /// Writes one row. `action`: "allocate", "allocate failure" or "free".
  void write(const char* action, const void* pointer, size_t size, arcpool_stream_t stream);

 private:
  std::mutex mutex_;
  std::atomic<FILE*> file_{nullptr};
};

}  // namespace arcpool::detail
