#include "observe/stream_stats.hpp"

#include <cstring>

namespace arcpool::detail {

void stream_stats::read(arcpool_stream_stats_t* out) const noexcept {
  const int64_t now = bytes_in_use.load(std::memory_order_relaxed);
  const int64_t peak = bytes_in_use_peak.load(std::memory_order_relaxed);
  out->bytes_in_use_current = static_cast<uint64_t>(now);
  out->bytes_in_use_peak = static_cast<uint64_t>(peak > now ? peak : now);
  out->cache_hits = cache_hits.load(std::memory_order_relaxed);
  out->allocations = allocations.load(std::memory_order_relaxed) + out->cache_hits;
  out->cross_stream_frees = cross_stream_frees.load(std::memory_order_relaxed);
  out->deferred_frees = deferred_frees.load(std::memory_order_relaxed);
}

stream_stats* stream_stats_table::take(arcpool_stream_t handle, uint64_t id,
                                       spinlock& guard) noexcept {
  std::lock_guard<std::mutex> lock(take_mutex_);
  return take_locked(handle, id, guard);
}

void stream_stats_table::take_legacy_slow(arcpool_stream_t handle, uint64_t id,
                                          spinlock& guard) noexcept {
  std::lock_guard<std::mutex> lock(take_mutex_);
  if (legacy_taken_.load(std::memory_order_relaxed)) return;  // another thread's resolve
  legacy_.store(take_locked(handle, id, guard), std::memory_order_release);
  legacy_taken_.store(true, std::memory_order_release);
}

stream_stats* stream_stats_table::take_locked(arcpool_stream_t handle, uint64_t id,
                                              spinlock& guard) noexcept {
  const size_t i = taken_.load(std::memory_order_relaxed);
  if (i == kRows) return &other_;
  owners_[i].handle = handle;
  owners_[i].id = id;
  rows_[i].guard_with(guard);
  taken_.store(i + 1, std::memory_order_release);
  return &rows_[i];
}

void stream_stats_table::retire(const stream_stats* row) noexcept {
  if (row < rows_ || row >= rows_ + kRows) return;
  owners_[row - rows_].retired.store(true, std::memory_order_relaxed);
}

size_t stream_stats_table::read(void* rows, size_t row_size, size_t capacity) const noexcept {
  const size_t n = taken_.load(std::memory_order_acquire);
  for (size_t i = 0; i <= n && i < capacity; ++i) {
    arcpool_stream_stats_t row{};
    if (i < n) {
      row.stream = owners_[i].handle;
      row.stream_id = owners_[i].id;
      row.retired = owners_[i].retired.load(std::memory_order_relaxed) ? 1 : 0;
      rows_[i].read(&row);
    } else {
      row.other = 1;
      other_.read(&row);
    }
    std::memcpy(static_cast<char*>(rows) + i * row_size, &row,
                row_size < sizeof(row) ? row_size : sizeof(row));
  }
  return n + 1;
}

void stream_stats_table::reset_peaks() noexcept {
  const size_t n = taken_.load(std::memory_order_acquire);
  for (size_t i = 0; i < n; ++i)
    rows_[i].reset_peak();
  other_.reset_peak();
}

}  // namespace arcpool::detail
