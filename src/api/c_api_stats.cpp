// The C API's statistics: the allocator-wide and per-stream figures, their JSON, and the memory
// snapshot in PyTorch's format (design.md §11).
#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

#include "api/entry.hpp"
#include "core/allocator.hpp"
#include "support/status.hpp"

using arcpool::detail::fail;
using arcpool::detail::from_handle;
using arcpool::detail::api::copy_versioned;
using arcpool::detail::api::guarded;
using arcpool::detail::api::null_argument;

extern "C" {

arcpool_status_t arcpool_stats_get(const arcpool_allocator_t* allocator,
                                   arcpool_stats_t* out_stats) {
  ARCPOOL_REQUIRE_ARG(allocator);
  ARCPOOL_REQUIRE_ARG(out_stats);
  arcpool_stats_t full{};
  from_handle(allocator)->read_stats(&full);
  return copy_versioned(full, out_stats, __func__);
}

arcpool_status_t arcpool_stats_reset_peaks(arcpool_allocator_t* allocator) {
  ARCPOOL_REQUIRE_ARG(allocator);
  from_handle(allocator)->reset_peaks();
  return ARCPOOL_STATUS_SUCCESS;
}

arcpool_status_t arcpool_stream_stats_list(const arcpool_allocator_t* allocator,
                                           arcpool_stream_stats_t* rows, size_t row_size,
                                           size_t capacity, size_t* out_count) {
  ARCPOOL_REQUIRE_ARG(allocator);
  ARCPOOL_REQUIRE_ARG(out_count);
  if (rows == nullptr && capacity != 0) return null_argument(__func__, "rows");
  constexpr size_t kStreamFields = offsetof(arcpool_stream_stats_t, bytes_in_use_current);
  if (row_size < kStreamFields) {
    return fail(
        ARCPOOL_STATUS_INVALID_ARGUMENT,
        "arcpool_stream_stats_list: row_size %zu is smaller than the stream fields (%zu bytes)",
        row_size, kStreamFields);
  }
  *out_count = from_handle(allocator)->read_stream_stats(rows, row_size, capacity);
  return ARCPOOL_STATUS_SUCCESS;
}

arcpool_status_t arcpool_stats_json(const arcpool_allocator_t* allocator, char* buffer,
                                    size_t capacity, size_t* out_length) {
  if (buffer == nullptr && capacity != 0) return null_argument(__func__, "buffer");
  return guarded([&] {
    arcpool_stats_t s{};
    std::vector<arcpool_stream_stats_t> rows(arcpool::detail::stream_stats_table::kRows + 1);
    if (allocator != nullptr) {
      from_handle(allocator)->read_stats(&s);
      rows.resize(
          from_handle(allocator)->read_stream_stats(rows.data(), sizeof(rows[0]), rows.size()));
    } else {  // an allocator that has done nothing: its other-streams row alone
      rows.resize(1);
      rows[0].other = 1;
    }
    const std::string json = arcpool::detail::stats_to_json(s, rows);
    if (out_length != nullptr) *out_length = json.size();
    if (capacity > 0) {
      const size_t n = json.size() < capacity - 1 ? json.size() : capacity - 1;
      std::memcpy(buffer, json.data(), n);
      buffer[n] = '\0';
    }
    return ARCPOOL_STATUS_SUCCESS;
  });
}

arcpool_status_t arcpool_memory_snapshot(const arcpool_allocator_t* allocator, void* buffer,
                                         size_t capacity, size_t* out_size) {
  ARCPOOL_REQUIRE_ARG(allocator);
  ARCPOOL_REQUIRE_ARG(out_size);
  if (buffer == nullptr && capacity != 0) return null_argument(__func__, "buffer");
  return guarded([&] {
    const auto& a = *from_handle(allocator);
    if (!a.memory_history().enabled()) {
      return fail(ARCPOOL_STATUS_UNSUPPORTED,
                  "memory snapshot: the allocator records no history (create it "
                  "with history_entries, or with ARCPOOL_HISTORY=N set)");
    }
    const std::string snapshot = a.memory_history().snapshot_pickle(a.drv().device());
    *out_size = snapshot.size();
    if (capacity == 0) return ARCPOOL_STATUS_SUCCESS;
    if (capacity < snapshot.size()) {
      return fail(ARCPOOL_STATUS_INVALID_ARGUMENT,
                  "memory snapshot: a buffer of %zu bytes for a snapshot of %zu", capacity,
                  snapshot.size());
    }
    std::memcpy(buffer, snapshot.data(), snapshot.size());
    return ARCPOOL_STATUS_SUCCESS;
  });
}

}  // extern "C"
