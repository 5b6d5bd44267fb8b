// Statistics of one allocator, generated from the lists in arcpool.h (design.md §11).
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "arcpool/arcpool.h"
#include "drivers/driver.hpp"
#include "support/shards.hpp"

namespace arcpool::detail {

/// The allocator's gauges and counters, one field per entry of the lists in arcpool.h.
struct stats {
#define ARCPOOL_STATS_GAUGE_MEMBER_(name, doc) sharded_gauge name;
  ARCPOOL_STATS_GAUGES(ARCPOOL_STATS_GAUGE_MEMBER_)
#undef ARCPOOL_STATS_GAUGE_MEMBER_
#define ARCPOOL_STATS_COUNTER_MEMBER_(name, doc) sharded_counter name;
  ARCPOOL_STATS_COUNTERS(ARCPOOL_STATS_COUNTER_MEMBER_)
#undef ARCPOOL_STATS_COUNTER_MEMBER_

  /// Byte gauges flush per-thread changes beyond this many bytes (count gauges: 64); see
  /// sharded_gauge for what it means for the peaks.
  static constexpr int64_t kByteFlush = 1 << 20;
  static constexpr int64_t kCountFlush = 64;

  stats() {
    bytes_in_use.set_flush_threshold(kByteFlush);
    bytes_held.set_flush_threshold(kByteFlush);
    bytes_pending_free.set_flush_threshold(kByteFlush);
    bytes_cached.set_flush_threshold(kByteFlush);
    allocations_in_use.set_flush_threshold(kCountFlush);
  }

  /// Adds `n` to a counter.
  static void count(sharded_counter& counter, int64_t n = 1) noexcept {
    counter.add(n);
  }

  /// Fills the C struct (whose struct_size and version the caller set) with these values and
  /// the pool's figures.
  void read(const pool_figures& pool, arcpool_stats_t* out) const;

  /// Resets every peak to its current value.
  void reset_peaks();
};

/// The C struct as one JSON object.
std::string stats_to_json(const arcpool_stats_t& s);

}  // namespace arcpool::detail
