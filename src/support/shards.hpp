// Per-thread shards: counters that threads update without contending, summed on read
// (design.md §7: no global lock or shared counter on the hot path). The statistics keep their own
// block per shard (observe/stats.hpp).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "support/thread_state.hpp"

namespace arcpool::detail {

/// Number of shards. Each of the first kShards - 1 live threads owns one exclusively (its
/// updates are a plain load and store); threads beyond that share the last one (atomic add).
inline constexpr size_t kShards = 64;

/// Assigns the calling thread's slot (first use).
shard_slot assign_thread_shard() noexcept;

/// The slot of the thread whose state `ts` is.
inline shard_slot thread_shard(thread_state& ts) noexcept {
  const shard_slot s = ts.slot;
  return s.index != SIZE_MAX ? s : assign_thread_shard();
}
/// The calling thread's slot.
inline shard_slot thread_shard() noexcept {
  return thread_shard(this_thread_state());
}

/// A value alone on its cache line.
template <class T>
struct alignas(64) padded {
  T value{};
};

static_assert(alignof(padded<std::atomic<int64_t>>) == 64 &&
                  sizeof(padded<std::atomic<int64_t>>) == 64,
              "a padded shard value is alone on its cache line");

/// Adds `n` to `v`, owned by the calling thread alone or shared.
inline void shard_add(std::atomic<int64_t>& v, int64_t n, bool exclusive,
                      std::memory_order order = std::memory_order_relaxed) noexcept {
  if (exclusive) {
    v.store(v.load(std::memory_order_relaxed) + n, order);
  } else {
    v.fetch_add(n, order);
  }
}

/// A counter summed over per-thread shards: adding never contends.
class sharded_counter {
 public:
  void add(int64_t n = 1) noexcept { add(thread_shard(), n); }
  /// Adds through the calling thread's slot, looked up by the caller.
  void add(shard_slot s, int64_t n) noexcept { shard_add(shards_[s.index].value, n, s.exclusive); }
  /// The sum; exact once the adding threads are quiescent.
  int64_t sum() const noexcept {
    int64_t total = 0;
    for (const auto& s : shards_)
      total += s.value.load(std::memory_order_relaxed);
    return total;
  }

 private:
  padded<std::atomic<int64_t>> shards_[kShards];
};

/// A count of live objects, per thread shard, whose zero a reader can trust while other
/// threads still count. A sum reads the shards one after another, so an addition in a shard it
/// has read already, followed by a removal in one it reads later, would read as zero with an
/// object still live. Additions ordered before every read (through the object's owner: a handle
/// the reader's caller released) need nothing more. Additions that may race a read (made
/// through a live object, such as a deallocation that makes a record for a graph's deferred
/// free) go through add_racing, which also counts them in a generation that zero() reads before
/// and after its sum.
class live_count {
 public:
  /// Adds `n` through the calling thread's slot `s`, ordered before every zero() that can
  /// follow it.
  void add(shard_slot s, int64_t n) noexcept { shard_add(shards_[s.index].value, n, s.exclusive); }
  void add(int64_t n = 1) noexcept { add(thread_shard(), n); }
  /// Adds one object that may be made while a zero() reads: counted, then published in the
  /// generation (release: a zero() that reads the new generation sees the count too).
  void add_racing() noexcept {
    add(1);
    racing_.fetch_add(1, std::memory_order_release);
  }
  /// Removes `n`, with release order: the caller's earlier writes happen before a zero() that
  /// sees this change.
  void remove_release(shard_slot s, int64_t n = 1) noexcept {
    shard_add(shards_[s.index].value, -n, s.exclusive, std::memory_order_release);
  }
  /// Whether no object is live. A racing addition that this sum missed came after the first
  /// read of the generation (it was published after its count), and one whose object is gone
  /// already, when a later shard read its removal, came before the second: the generations
  /// differ. `after_read(i)` runs after shard i is read (a test's seam; nothing otherwise).
  template <class AfterRead>
  bool zero(AfterRead&& after_read) const noexcept {
    const uint64_t generation = racing_.load(std::memory_order_acquire);
    int64_t total = 0;
    for (size_t i = 0; i < kShards; ++i) {
      total += shards_[i].value.load(std::memory_order_acquire);
      after_read(i);
    }
    return total == 0 && racing_.load(std::memory_order_acquire) == generation;
  }
  bool zero() const noexcept {
    return zero([](size_t) {});
  }

 private:
  padded<std::atomic<int64_t>> shards_[kShards];
  std::atomic<uint64_t> racing_{0};  ///< additions made through add_racing
};

}  // namespace arcpool::detail
