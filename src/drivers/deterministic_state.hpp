// The deterministic driver's checker state (deterministic_driver.cpp): vector clocks, streams
// and their queued tasks, event records, and what the checker knows of each block.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace arcpool::detail::deterministic::state {

/// A vector clock: one entry per stream slot.
using vclock = std::vector<uint64_t>;

/// Raises `into` to `other`, entry by entry.
inline void join(vclock& into, const vclock& other) {
  if (into.size() < other.size()) into.resize(other.size(), 0);
  for (size_t i = 0; i < other.size(); ++i)
    into[i] = std::max(into[i], other[i]);
}

/// Whether `a` happened before or is `b` (every entry at most `b`'s).
inline bool leq(const vclock& a, const vclock& b) {
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] > (i < b.size() ? b[i] : 0)) return false;
  }
  return true;
}

/// Completion of one event record, with the recording stream's clock at that point.
struct marker {
  bool done = false;
  vclock clock;
};

/// An event: its last record's completion.
struct det_event {
  std::shared_ptr<marker> last;  // null: never recorded (complete)
};

struct det_stream;

/// One queued task. `ready` (may be empty) says whether it can run now; `run` runs it.
/// `host` is the host's clock when it was enqueued: work enqueued after the host observed
/// something complete is ordered after it (CUDA's order through the host).
struct task {
  std::function<bool()> ready;
  std::function<void(det_stream&)> run;
  vclock host = {};
};

/// A stream: its clock and its queue.
struct det_stream {
  uint64_t id = 0;
  size_t slot = 0;  // index in the vector clocks
  vclock clock;
  std::deque<task> queue;
  uint64_t enqueued = 0;  // tasks ever queued
  bool capturing = false;
  std::string name() const { return "stream " + std::to_string(id); }
};

/// One declared access to a block.
struct access_record {
  vclock clock;
  std::string label;
  bool write;
};

/// What the checker knows of one block of memory.
struct block_state {
  size_t bytes = 0;
  uint64_t epoch = 0;  // bumped at every acquire
  bool acquired = false;
  bool released = false;
  vclock acquire_clock;
  vclock release_clock;
  std::string release_label;
  std::vector<access_record> accesses;
};

}  // namespace arcpool::detail::deterministic::state
