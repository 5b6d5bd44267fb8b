// Statistics per stream (design.md §11): a bounded table of rows, one for each of the first
// kRows streams created or registered with an allocator, and one row for every other stream.
//
// An allocation counts on the row of its origin stream from its allocation to its free: its
// bytes in use, and the cache hit, cross-stream free or deferred free it took. The figures are
// exact (one relaxed atomic per figure, on the row's own cache line, shared by the threads that
// use that stream), so the rows and the other-streams row add up to the allocator's totals.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>

#include "arcpool/arcpool.h"

namespace arcpool::detail {

/// One stream's figures.
struct alignas(64) stream_stats {
  std::atomic<int64_t> bytes_in_use{0};
  std::atomic<int64_t> bytes_in_use_peak{0};
  std::atomic<uint64_t> allocations{0};  ///< those not from the cache (read() adds the hits)
  std::atomic<uint64_t> cache_hits{0};
  std::atomic<uint64_t> cross_stream_frees{0};
  std::atomic<uint64_t> deferred_frees{0};

  /// An allocation of `bytes` on this stream (a cache hit or not).
  void allocated(size_t bytes, bool cache_hit) noexcept {
    (cache_hit ? cache_hits : allocations).fetch_add(1, std::memory_order_relaxed);
    const int64_t now =
        bytes_in_use.fetch_add(static_cast<int64_t>(bytes), std::memory_order_relaxed) +
        static_cast<int64_t>(bytes);
    int64_t peak = bytes_in_use_peak.load(std::memory_order_relaxed);
    while (now > peak &&
           !bytes_in_use_peak.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
    }
  }
  /// A graph allocation on this stream: counted, its bytes are graph memory (not in use here).
  void allocated_in_graph() noexcept { allocations.fetch_add(1, std::memory_order_relaxed); }
  /// The free (deallocation or export) of `bytes` allocated on this stream.
  void freed(size_t bytes) noexcept {
    bytes_in_use.fetch_sub(static_cast<int64_t>(bytes), std::memory_order_relaxed);
  }
  void cross_stream_free() noexcept { cross_stream_frees.fetch_add(1, std::memory_order_relaxed); }
  void deferred_free() noexcept { deferred_frees.fetch_add(1, std::memory_order_relaxed); }
  /// Restarts the peak at the current value.
  void reset_peak() noexcept {
    bytes_in_use_peak.store(bytes_in_use.load(std::memory_order_relaxed),
                            std::memory_order_relaxed);
  }
  /// The figures into `out` (the stream fields are the table's to fill).
  void read(arcpool_stream_stats_t* out) const noexcept;
};

/// The rows of one allocator.
class stream_stats_table {
 public:
  /// Streams with a row of their own; later ones count on other().
  static constexpr size_t kRows = ARCPOOL_STREAM_STATS_ROWS;

  /// A row for a stream just created or registered (`handle`, `id`), or other() when every row
  /// is taken. Rows are never handed out twice: a retired stream keeps its row.
  stream_stats* take(arcpool_stream_t handle, uint64_t id) noexcept;
  /// The row of every stream without one of its own.
  stream_stats& other() noexcept { return other_; }
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
  stream_stats rows_[kRows];
  owner owners_[kRows];
  std::mutex take_mutex_;
  std::atomic<size_t> taken_{0};  ///< rows handed out; a row's owner is written before it counts
  stream_stats other_;
};

}  // namespace arcpool::detail
