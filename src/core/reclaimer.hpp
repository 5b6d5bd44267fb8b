// The reclaim worker of one allocator: polls the fences of deferred frees and gives the memory
// back once they all completed, on the origin stream when it is provably alive, else on its own
// non-blocking reclaim stream (design.md §4, strategy 3). Never blocks a stream; never runs
// from a CUDA host callback. It also runs the work that CUDA's user-object destructors hand it
// (posted_task), since those destructors may neither call CUDA nor block.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>

#include "core/fence.hpp"
#include "core/stream.hpp"
#include "core/task_inbox.hpp"
#include "drivers/driver.hpp"
#include "observe/history.hpp"
#include "observe/stats.hpp"
#include "support/spinlock.hpp"

namespace arcpool::detail {

/// Runs the before-free hook `hook` (not null) on [pointer, pointer + bytes) and `s` with `d`'s
/// device current (driver::run_on_device): arcpool.h lets the hook enqueue work on `s`, which
/// must land on the allocator's device, as the free that follows does, whatever the freeing
/// thread's current device.
void run_before_free(driver& d, arcpool_before_free_t hook, void* user_data, void* pointer,
                     size_t bytes, stream_handle s) noexcept;

/// One deferred free: memory to give back (or foreign memory to report through `on_free`)
/// once every fence has completed. Made by reclaimer::prepare, before the caller changes
/// anything, so that queueing it cannot fail.
struct reclaim_item {
  void* pointer = nullptr;  ///< the pool's pointer, or the imported pointer
  size_t bytes = 0;         ///< pool bytes (held bytes), or the imported size
  fence_list fences;
  /// How many of `fences`, from the first, were seen complete (they stay until the free).
  size_t fences_completed = 0;
  stream_ref origin;  ///< preferred stream for the pool free
  /// External memory: called instead of a pool free (null for pool memory).
  arcpool_on_free_t on_free = nullptr;
  void* on_free_user_data = nullptr;
  /// True when the item came from a deallocation involving another stream than the origin,
  /// routed to the origin for its sake (counted as origin-routed or fallback when it completes).
  bool routed_to_origin = false;
  /// Graph memory (docs/graphs.md): not counted in the pool's gauges.
  bool graph = false;
  /// The statistics row whose deferred_frees it counts on (the origin's; design.md §11).
  stream_stats* counted_on = nullptr;
  /// Created or registered streams that were capturing at the deallocation: each is fenced
  /// when the worker first finds it alive and not capturing (or its final fence is taken),
  /// into room that `fences` reserved for them at the deallocation.
  small_vector<stream_ref, 2> fence_later;
  /// The reclaimer's: its queue's link, and whether a poll found a fence failed.
  reclaim_item* next = nullptr;
  bool failed = false;
};

class reclaimer {
 public:
  /// `before_free` (may be null) runs before every pool free it enqueues (the poison hook).
  reclaimer(driver& drv, event_pool& events, stats& counters, history& recorded,
            arcpool_before_free_t before_free, void* before_free_user_data);
  /// Completes every pending item (blocking on its fences) and joins the worker. When the
  /// process is exiting it only stops the worker: no CUDA call after teardown.
  ~reclaimer();
  reclaimer(const reclaimer&) = delete;
  reclaimer& operator=(const reclaimer&) = delete;

  /// An item for enqueue, made before the caller changes anything: queueing it then allocates
  /// nothing and cannot fail, also where the caller may not fail (the last reference of
  /// memory whose free is deferred). Starts the worker. Throws std::bad_alloc (no host memory)
  /// or std::system_error (no thread could start) and changes nothing then.
  std::unique_ptr<reclaim_item> prepare();
  /// Queues `item` (from prepare); the worker gives it back once its fences completed. Never
  /// blocks, allocates nothing.
  void enqueue(std::unique_ptr<reclaim_item> item) noexcept;

  /// Starts the worker, once. Throws std::bad_alloc (no host memory) or std::system_error (no
  /// thread could start) and changes nothing then.
  void start();
  /// Announces a post() to come (a user object armed with a posted task, after start): keeps
  /// the worker looking at its inbox now and then while idle until the post has come
  /// (task_inbox::expect: takes the worker's mutex once). Allocates nothing.
  void expect_post() noexcept;
  /// Hands `task` to the worker without blocking: no lock, no allocation, no CUDA call; a
  /// lock-free push and a notification. The caller keeps the reclaimer alive until it returns.
  void post(posted_task* task) noexcept;

  /// Completes every pending item now: blocks on its fences, frees on the reclaim stream and
  /// synchronizes that stream, so the memory is reusable when it returns. For out-of-memory
  /// retries, trim and teardown. An item that waits for a stream capturing again (a free
  /// deferred to a graph's end) cannot be fenced now: it stays queued, unless `final` (teardown,
  /// when the streams go), which gives its memory up and counts a reclaim failure.
  arcpool_status_t drain(bool final = false);

  /// Runs one polling pass on the calling thread, as the worker does: completes every item
  /// whose fences all completed. Returns how many it completed. Tests use it to prove that
  /// nothing is given back while a fence is outstanding.
  size_t poll_once();

  /// True on the worker thread (inside an on_free callback), also once another thread took the
  /// worker to join it.
  bool on_worker_thread() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return worker_id_ == std::this_thread::get_id();
  }

  /// True while a user object armed with a posted task (expect_post) has not posted it, or a
  /// posted task has not run to its end: tests wait for destructors run on CUDA's own thread.
  bool posts_outstanding() const noexcept { return inbox_.outstanding(); }

  /// Items queued and not yet completed, and posted tasks not yet run to their end (a task may
  /// enqueue an item: it is never between the inbox and the queue unseen).
  size_t pending() const;

  /// The reclaimer's own non-blocking stream, created on first use; never captured.
  arcpool_status_t reclaim_stream(stream_handle* out);

  /// Stops the worker (first completing every item with `drain_first`) and returns once it has
  /// exited, also when another thread is joining it (the exit hook's listener, while the janitor
  /// deletes the allocator). The allocator calls it before destroying its streams; the
  /// destructor calls it again (a no-op then).
  void stop_worker(bool drain_first);

 private:
  void run();
  /// Unlinks every item whose fences completed (or one failed) from the queue, and returns
  /// them as a list (lock held).
  reclaim_item* take_completed_locked();
  /// Completes and deletes the items of a list from take_completed_locked (lock not held);
  /// returns how many.
  size_t finish(reclaim_item* done);
  void start_locked();
  /// Runs every posted task, oldest first (lock not held). True when there was one.
  bool run_posted();
  /// Drops completed fences from the back of `item`; true when none is left (or one failed,
  /// which `failed` reports).
  bool poll(reclaim_item& item, bool* failed);
  /// Takes the fences of `item.fence_later`; false while one of those streams is capturing
  /// (`failed` reports a failed call).
  bool take_late_fences(reclaim_item& item, bool* failed);
  /// Gives `item` back. Outside the lock.
  void complete(reclaim_item& item, bool failed, bool prefer_origin);
  /// Empties a completed item (its fences go) and keeps it for prepare, or deletes it.
  void recycle(std::unique_ptr<reclaim_item> item) noexcept;

  /// Enqueues the pool free of `item` on `s`, after the poison hook.
  arcpool_status_t free_on(reclaim_item& item, stream_handle s);

  driver& driver_;
  event_pool& events_;
  stats& stats_;
  history& history_;
  const arcpool_before_free_t before_free_;
  void* const before_free_user_data_;

  mutable std::mutex mutex_;
  std::condition_variable work_cv_;
  std::condition_variable idle_cv_;
  reclaim_item* queue_ = nullptr;  ///< queued items, linked through `next` (owned)
  size_t queued_ = 0;
  /// Set once start_locked has nothing left to start (the worker runs, or none may): prepare
  /// then takes no lock.
  std::atomic<bool> started_{false};
  /// Completed items kept for prepare, emptied (at most kSpareItems), linked through `next`:
  /// a deferred free then takes no heap allocation made on another thread (the worker deletes
  /// what the freeing thread made, which costs glibc's malloc more than the free's own work).
  spinlock spare_lock_;
  reclaim_item* spare_ = nullptr;
  size_t spare_count_ = 0;
  static constexpr size_t kSpareItems = 64;
  size_t completing_ = 0;  ///< items the worker moved out and is completing now
  bool stop_ = false;
  std::thread worker_;
  std::thread::id worker_id_;  ///< the worker's, kept after worker_ is taken to be joined
  bool joining_ = false;       ///< a thread took worker_ and has not finished joining it
  /// The exit hook's listener (stops the worker), removed only by the destructor, which waits
  /// for it if it is running.
  int exit_listener_ = -1;

  std::mutex stream_mutex_;
  bool have_stream_ = false;
  stream_handle stream_ = nullptr;

  static constexpr std::chrono::microseconds kMinBackoff{20};
  static constexpr std::chrono::microseconds kMaxBackoff{1000};

  task_inbox inbox_;  ///< posted tasks, woken through mutex_ and work_cv_
};

}  // namespace arcpool::detail
