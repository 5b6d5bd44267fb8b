// Statistics per stream (design.md §11): a bounded table of rows, one for each of the first
// kRows streams created or registered with an allocator, and one row for every other stream.
//
// An allocation counts on the row of its origin stream from its allocation to its free: its
// bytes in use, and the cache hit, cross-stream free or deferred free it took. The figures are
// exact (one relaxed atomic per figure, on the row's own cache line, shared by the threads that
// use that stream), so the rows and the other-streams row add up to the allocator's totals.
//
// A stream's own row is guarded by its stream cache's lock: its bytes, peak and allocation
// counts change only under that lock, with plain loads and stores, so that the fast path, which
// holds the lock for its cache hit or its free into the cache, counts with no locked
// instruction. The other-streams row, shared by streams with different caches, has no guard
// and changes by atomic read-modify-writes. Cross-stream and deferred frees are atomic
// read-modify-writes on every row.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>

#include "arcpool/arcpool.h"
#include "support/spinlock.hpp"

namespace arcpool::detail {

/// One stream's figures.
struct alignas(64) stream_stats {
  std::atomic<int64_t> bytes_in_use{0};
  std::atomic<int64_t> bytes_in_use_peak{0};
  std::atomic<uint64_t> allocations{0};  ///< those not from the cache (read() adds the hits)
  std::atomic<uint64_t> cache_hits{0};
  std::atomic<uint64_t> cross_stream_frees{0};
  std::atomic<uint64_t> deferred_frees{0};

  /// Makes `guard` the lock this row's bytes, peak and allocation counts change under: a
  /// stream's own row, guarded by its cache's lock. Set once, before the row is used.
  void guard_with(spinlock& guard) noexcept { guard_ = &guard; }

  /// An allocation of `bytes` on this stream (a cache hit or not).
  void allocated(size_t bytes, bool cache_hit) noexcept {
    if (guard_ == nullptr) return allocated_atomically(bytes, cache_hit);
    std::lock_guard<spinlock> lock(*guard_);
    allocated_guarded(bytes, cache_hit);
  }
  /// allocated, by a caller that holds `held`: counts and returns true if `held` is this row's
  /// guard; otherwise changes nothing and returns false (the caller calls allocated once it
  /// released `held`).
  bool allocated_if_guarded_by(const spinlock& held, size_t bytes, bool cache_hit) noexcept {
    if (guard_ != &held) return false;
    allocated_guarded(bytes, cache_hit);
    return true;
  }
  /// A graph allocation on this stream: counted, its bytes are graph memory (not in use here).
  void allocated_in_graph() noexcept {
    if (guard_ == nullptr) {
      allocations.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    std::lock_guard<spinlock> lock(*guard_);
    increment(allocations);
  }
  /// The free (deallocation or export) of `bytes` allocated on this stream.
  void freed(size_t bytes) noexcept {
    if (guard_ == nullptr) {
      bytes_in_use.fetch_sub(static_cast<int64_t>(bytes), std::memory_order_relaxed);
      return;
    }
    std::lock_guard<spinlock> lock(*guard_);
    freed_guarded(bytes);
  }
  /// freed, by a caller that holds `held`, as allocated_if_guarded_by.
  bool freed_if_guarded_by(const spinlock& held, size_t bytes) noexcept {
    if (guard_ != &held) return false;
    freed_guarded(bytes);
    return true;
  }
  void cross_stream_free() noexcept { cross_stream_frees.fetch_add(1, std::memory_order_relaxed); }
  void deferred_free() noexcept { deferred_frees.fetch_add(1, std::memory_order_relaxed); }
  /// Restarts the peak at the current value.
  void reset_peak() noexcept {
    std::unique_lock<spinlock> lock;
    if (guard_ != nullptr) lock = std::unique_lock<spinlock>(*guard_);
    bytes_in_use_peak.store(bytes_in_use.load(std::memory_order_relaxed),
                            std::memory_order_relaxed);
  }
  /// The figures into `out` (the stream fields are the table's to fill).
  void read(arcpool_stream_stats_t* out) const noexcept;

 private:
  spinlock* guard_ = nullptr;  ///< null: the other-streams row (atomic read-modify-writes)

  /// The changes under the guard: a relaxed load and store each, no locked instruction.
  static void increment(std::atomic<uint64_t>& v) noexcept {
    v.store(v.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  }
  void allocated_guarded(size_t bytes, bool cache_hit) noexcept {
    increment(cache_hit ? cache_hits : allocations);
    const int64_t now = bytes_in_use.load(std::memory_order_relaxed) + static_cast<int64_t>(bytes);
    bytes_in_use.store(now, std::memory_order_relaxed);
    if (now > bytes_in_use_peak.load(std::memory_order_relaxed)) {
      bytes_in_use_peak.store(now, std::memory_order_relaxed);
    }
  }
  void freed_guarded(size_t bytes) noexcept {
    bytes_in_use.store(bytes_in_use.load(std::memory_order_relaxed) - static_cast<int64_t>(bytes),
                       std::memory_order_relaxed);
  }
  void allocated_atomically(size_t bytes, bool cache_hit) noexcept {
    (cache_hit ? cache_hits : allocations).fetch_add(1, std::memory_order_relaxed);
    const int64_t now =
        bytes_in_use.fetch_add(static_cast<int64_t>(bytes), std::memory_order_relaxed) +
        static_cast<int64_t>(bytes);
    int64_t peak = bytes_in_use_peak.load(std::memory_order_relaxed);
    while (now > peak &&
           !bytes_in_use_peak.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
    }
  }
};

static_assert(sizeof(stream_stats) == 64, "a stream's row fills one cache line of its own");

/// The rows of one allocator.
class stream_stats_table {
 public:
  /// Streams with a row of their own; later ones count on other().
  static constexpr size_t kRows = ARCPOOL_STREAM_STATS_ROWS;

  /// A row for a stream just created or registered (`handle`, `id`), guarded by `guard` (its
  /// cache's lock), or other() when every row is taken. Rows are never handed out twice: a
  /// retired stream keeps its row.
  stream_stats* take(arcpool_stream_t handle, uint64_t id, spinlock& guard) noexcept;
  /// The row of every stream without one of its own.
  stream_stats& other() noexcept { return other_; }
  /// Gives the legacy default stream (`handle`, `id`) a row of its own, guarded by `guard` (its
  /// cache's lock), if one is left: called when an allocator resolves the stream, so before any
  /// allocation counts on it. Once per table; later calls return at one load.
  void take_legacy(arcpool_stream_t handle, uint64_t id, spinlock& guard) noexcept {
    if (!legacy_taken_.load(std::memory_order_acquire)) take_legacy_slow(handle, id, guard);
  }
  /// The legacy default stream's row: other() until take_legacy gave it one of its own.
  stream_stats& legacy() noexcept { return *legacy_.load(std::memory_order_acquire); }
  /// Marks the stream of `row` retired (no effect on other()).
  void retire(const stream_stats* row) noexcept;

  /// Rows handed out so far, then the other-streams row. Writes up to `capacity` of them, each
  /// `row_size` bytes (a prefix of arcpool_stream_stats_t), and returns how many there are.
  size_t read(void* rows, size_t row_size, size_t capacity) const noexcept;

  /// Restarts every row's peak.
  void reset_peaks() noexcept;

 private:
  struct owner {
    arcpool_stream_t handle = nullptr;
    uint64_t id = 0;
    std::atomic<bool> retired{false};
  };
  /// take, with take_mutex_ held.
  stream_stats* take_locked(arcpool_stream_t handle, uint64_t id, spinlock& guard) noexcept;
  void take_legacy_slow(arcpool_stream_t handle, uint64_t id, spinlock& guard) noexcept;

  stream_stats rows_[kRows];
  owner owners_[kRows];
  std::mutex take_mutex_;
  std::atomic<size_t> taken_{0};  ///< rows handed out; a row's owner is written before it counts
  stream_stats other_;
  std::atomic<stream_stats*> legacy_{&other_};  ///< set before legacy_taken_
  std::atomic<bool> legacy_taken_{false};
};

}  // namespace arcpool::detail
