// Fences: recycled timing-disabled events standing for "all work queued on a stream up to here".
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <vector>

#include "drivers/driver.hpp"
#include "support/refcount.hpp"
#include "support/shards.hpp"
#include "support/small_vector.hpp"
#include "support/spinlock.hpp"

namespace arcpool::detail {

class event_pool;

/// One recorded event. Reference-counted: a fence held by a use record, a pending reclaim or an
/// indeterminate allocation is never recycled until released (design.md §6).
class fence {
 public:
  void retain() noexcept { refs_.increment(); }
  /// Drops a reference; the last one returns the event to its pool.
  void release() noexcept;

  /// The event, for waits and queries.
  event_handle event() const noexcept { return event_; }
  /// Identity of the stream the event was recorded on.
  uint64_t stream_id() const noexcept { return stream_id_; }

 private:
  friend class event_pool;
  fence(event_pool* pool, event_handle event) noexcept : pool_(pool), event_(event) {}

  refcount refs_{0};
  event_pool* const pool_;
  const event_handle event_;
  uint64_t stream_id_ = 0;
  /// The shard it was last recorded from: where it goes back when the thread that releases it
  /// keeps no more (event_pool::recycle).
  size_t home_ = 0;
  /// The next fence of its home shard's returned chain.
  fence* next_returned_ = nullptr;
};

using fence_ref = ref_ptr<fence>;

/// The fences of one operation: a few streams at most, kept inline.
using fence_list = small_vector<fence_ref, 4>;

/// A pool of timing-disabled events, one per allocator (and so per device). Events are created
/// on demand, never per operation once warm, and recycled when their fence is released. Free
/// events are kept in per-thread shards, so that threads taking fences do not contend. A fence
/// released on a thread whose shard is full goes back to the shard it was recorded from (that
/// shard's returned chain, which the thread holding the shard takes when it runs out of free
/// events), so that a thread whose fences another thread releases (the reclaim worker, after a
/// deferred free) reuses its events instead of creating new ones while the other destroys them.
class event_pool {
 public:
  /// `capacity`: events kept for reuse (per shard: all of it up to 64, an eighth above, and as
  /// many again on the way back to a shard); more are destroyed when released.
  event_pool(driver& drv, size_t capacity);
  /// Destroys the cached events. Every fence must have been released.
  ~event_pool();
  event_pool(const event_pool&) = delete;
  event_pool& operator=(const event_pool&) = delete;

  /// Records a new fence on stream `s` (identity `stream_id`), from the shard of `slot`, the
  /// calling thread's (thread_shard()).
  arcpool_status_t record(stream_handle s, uint64_t stream_id, fence_ref* out, shard_slot slot);
  arcpool_status_t record(stream_handle s, uint64_t stream_id, fence_ref* out) {
    return record(s, stream_id, out, thread_shard());
  }
  /// As record, for a stream that another thread may begin capturing at any moment. When `s`
  /// is capturing before the record, or after it (the record may have gone into the capture),
  /// `*capturing` is set and `*out` left empty; an event recorded then is destroyed, never
  /// pooled. A capture begun and ended between the record and the second check goes unseen.
  arcpool_status_t record_outside_capture(stream_handle s, uint64_t stream_id, fence_ref* out,
                                          bool* capturing);

  /// Events created so far (diagnostics and tests).
  size_t events_created() const;

 private:
  friend class fence;
  void recycle(fence* f) noexcept;

  /// One thread shard's free events (a fence released on another thread joins that thread's
  /// shard while it has room). Only the shared last shard is locked: an exclusive shard has
  /// one thread at a time (support/shards.hpp hands an index to its next thread under a
  /// mutex). A spinlock: its holder pushes, pops, or moves at most a capacity's worth of
  /// returned fences. `returned`: fences recorded from this shard and released where there was
  /// no room, a lock-free stack through fence::next_returned_ that any thread pushes onto and
  /// the shard's thread takes whole, about a capacity's worth at most. Fences wait there until
  /// a thread holding the shard runs out of free events, or until the pool goes.
  struct alignas(64) shard {
    spinlock mutex;
    std::vector<fence*> free;
    std::atomic<fence*> returned{nullptr};
    /// Fences on `returned`, or about to be: a fence finding a capacity's worth is destroyed.
    std::atomic<size_t> returned_count{0};
  };
  /// For `mine` (the calling thread's shard) with no free event: one fence of its returned
  /// chain, whose others join its free events up to the shard's capacity; the rest, a chain,
  /// in `*excess` for the caller to destroy. Null when none was returned.
  [[gnu::noinline]] fence* take_returned(shard& mine, fence** excess);
  /// Destroys the event of `f`, and `f`.
  void destroy(fence* f) noexcept;
  /// destroy, for each fence of the returned chain that starts at `f`.
  void destroy_chain(fence* f) noexcept;
  /// Whether `mine` has room for one more free event: below its capacity, and within the
  /// storage reserved for it (reserve_room), so that recycle, which is noexcept, never allocates.
  bool has_room(const shard& mine) const noexcept {
    return mine.free.size() < shard_capacity_ && mine.free.size() != mine.free.capacity();
  }
  /// Reserves storage for the shard's capacity, when a thread holding `mine` runs out of free
  /// events. With no host memory for it the shard keeps what room it has: the fences released
  /// past it go to their own shard's returned chain, or are destroyed.
  void reserve_room(shard& mine) noexcept;
  /// Runs `fn(shard)` on the shard of `slot` (the calling thread's), under its lock if shared.
  template <class F>
  auto with_own_shard(shard_slot slot, F&& fn) {
    shard& mine = shards_[slot.index];
    if (slot.exclusive) return fn(mine);
    std::lock_guard<spinlock> lock(mine.mutex);
    return fn(mine);
  }
  static_assert(alignof(shard) == 64 && sizeof(shard) % 64 == 0,
                "each thread's event shard fills whole cache lines of its own");

  driver& driver_;
  const size_t shard_capacity_;
  shard shards_[kShards];
  std::atomic<size_t> created_{0};
};

}  // namespace arcpool::detail
