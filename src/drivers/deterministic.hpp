// The deterministic mode of the host driver (design.md §8), as tests and the fuzzer drive it.
//
// Streams have no threads: their queued work runs only when the caller drives the scheduler
// (run(), or any blocking call, which runs work until its condition holds), and a seeded RNG
// picks which runnable stream goes next, so a run is replayable from its seed.
//
// The happens-before checker gives every stream a vector clock. Running a task ticks its
// stream's clock; an event record snapshots it; a wait joins the snapshot into the waiting
// stream's clock. Against these clocks it checks every block of memory:
//  - an access (declared with access()) must be ordered after the block's allocation, and a
//    write must be ordered with every other access to the same block (reads may overlap);
//  - every access must be ordered before the block's release: the pool free, or the point
//    where a fast-path cache kept it;
//  - no access may run after the release.
// Because an unordered pair is caught whichever of the two runs first, a missing fence is a
// certain failure, reported with the two operations named.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "drivers/driver.hpp"

namespace arcpool::detail::deterministic {

/// True if `d` is a deterministic host driver.
bool is_deterministic(const driver& d) noexcept;

/// Runs up to `steps` queued tasks (0: until every stream is empty or waits on work that can
/// never run), each on a stream the seeded scheduler picks. Returns the tasks run.
size_t run(driver& d, size_t steps = 0);

/// Declares a write (or a read) of [p, p + bytes) in stream order on `s`: checked when it
/// runs. `label` names it in reports.
arcpool_status_t access(driver& d, const void* p, size_t bytes, stream_handle s,
                        const std::string& label, bool write = true);

/// Makes later work on `waiter` wait for the work queued on `target` so far (an application's
/// own synchronization, e.g. before using a buffer on another stream).
arcpool_status_t wait_stream(driver& d, stream_handle waiter, stream_handle target);

/// Holds `s` until `*open` is true: work queued on `s` after this call runs only once the test
/// set it (a test latch). Nothing blocks meanwhile: the scheduler runs the other streams, and a
/// blocking call that needs `s` reports a deadlock instead of waiting forever.
arcpool_status_t hold(driver& d, stream_handle s, std::shared_ptr<const std::atomic<bool>> open);

/// Tasks queued on `s` so far (tests prove arcpool never touched a stream with it); 0 for a
/// stream the driver does not know.
uint64_t enqueued(const driver& d, stream_handle s);

/// Events created and not yet destroyed (tests prove an event was destroyed, not leaked).
size_t live_events(const driver& d);

/// Every violation found so far, each naming the operations involved.
std::vector<std::string> violations(const driver& d);

}  // namespace arcpool::detail::deterministic
