// Statistics of one allocator, generated from the lists in arcpool.h (DESIGN.md §11).
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "arcpool/arcpool.h"
#include "drivers/driver.hpp"

namespace arcpool::detail {

/// A value with a high-water mark.
class gauge {
 public:
  void add(uint64_t n) noexcept {
    raise_peak(current_.fetch_add(n, std::memory_order_relaxed) + n);
  }
  /// Adds `n` unless the result would exceed `limit`; returns whether it added.
  bool try_add(uint64_t n, uint64_t limit) noexcept {
    uint64_t now = current_.load(std::memory_order_relaxed);
    do {
      if (n > limit || now > limit - n) return false;
    } while (!current_.compare_exchange_weak(now, now + n, std::memory_order_relaxed));
    raise_peak(now + n);
    return true;
  }
  void sub(uint64_t n) noexcept { current_.fetch_sub(n, std::memory_order_relaxed); }
  uint64_t current() const noexcept { return current_.load(std::memory_order_relaxed); }
  uint64_t peak() const noexcept { return peak_.load(std::memory_order_relaxed); }
  void reset_peak() noexcept { peak_.store(current(), std::memory_order_relaxed); }

 private:
  void raise_peak(uint64_t now) noexcept {
    uint64_t peak = peak_.load(std::memory_order_relaxed);
    while (now > peak && !peak_.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
    }
  }

  std::atomic<uint64_t> current_{0};
  std::atomic<uint64_t> peak_{0};
};

/// The allocator's gauges and counters, one field per entry of the lists in arcpool.h.
struct stats {
#define ARCPOOL_STATS_GAUGE_MEMBER_(name, doc) gauge name;
  ARCPOOL_STATS_GAUGES(ARCPOOL_STATS_GAUGE_MEMBER_)
#undef ARCPOOL_STATS_GAUGE_MEMBER_
#define ARCPOOL_STATS_COUNTER_MEMBER_(name, doc) std::atomic<uint64_t> name{0};
  ARCPOOL_STATS_COUNTERS(ARCPOOL_STATS_COUNTER_MEMBER_)
#undef ARCPOOL_STATS_COUNTER_MEMBER_

  /// Adds `n` to a counter (relaxed: counters order nothing).
  static void count(std::atomic<uint64_t>& counter, uint64_t n = 1) noexcept {
    counter.fetch_add(n, std::memory_order_relaxed);
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
