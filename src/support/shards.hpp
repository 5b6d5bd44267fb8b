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
  /// Adds with release order: the caller's earlier writes happen before a sum_acquire that
  /// sees this change.
  void add_release(shard_slot s, int64_t n) noexcept {
    shard_add(shards_[s.index].value, n, s.exclusive, std::memory_order_release);
  }
  /// The sum; exact once the adding threads are quiescent.
  int64_t sum() const noexcept {
    int64_t total = 0;
    for (const auto& s : shards_)
      total += s.value.load(std::memory_order_relaxed);
    return total;
  }
  /// The sum, with acquire order (pairs with add_release).
  int64_t sum_acquire() const noexcept {
    int64_t total = 0;
    for (const auto& s : shards_)
      total += s.value.load(std::memory_order_acquire);
    return total;
  }

 private:
  padded<std::atomic<int64_t>> shards_[kShards];
};

}  // namespace arcpool::detail
