// Statistics of one allocator, generated from the lists in arcpool.h (design.md §11).
//
// Layout: every counter and every gauge's unflushed change sit in one block per thread shard,
// so that an operation looks its shard up once (stats::local) and updates neighbouring words
// of a few cache lines that no other thread writes.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "arcpool/arcpool.h"
#include "drivers/driver.hpp"
#include "support/shards.hpp"

namespace arcpool::detail {

/// The names of the counters and gauges: `stat::frees`, `stat::bytes_held`.
namespace stat {
#define ARCPOOL_STATS_ENUM_(name, doc) name,
enum counter : size_t {
  ARCPOOL_STATS_COUNTERS(ARCPOOL_STATS_ENUM_) ARCPOOL_STATS_GRAPH_COUNTERS(ARCPOOL_STATS_ENUM_)
  /// Internal, so that the fast path counts once where a free counts twice: a deallocation whose
  /// block its stream's cache kept, freed on its origin stream (or for another stream). Each
  /// counts as a cache free and a same-stream (cross-stream) free; stats::sum adds them in.
  cached_same_stream_frees,
  cached_cross_stream_frees,
  /// A deallocation by the fast path (allocator::free_into_cache): counts as a deallocation, a
  /// cache free and a same-stream free.
  fast_frees,
  kCounters
};
enum gauge : size_t {
  ARCPOOL_STATS_GAUGES(ARCPOOL_STATS_ENUM_) ARCPOOL_STATS_GRAPH_GAUGES(ARCPOOL_STATS_ENUM_) kGauges
};
#undef ARCPOOL_STATS_ENUM_
}  // namespace stat

/// The allocator's gauges and counters, one entry per entry of the lists in arcpool.h.
///
/// A cache hit counts as `cache_hits` alone, and sum() adds the hits to `allocations`; a free
/// into a stream's cache counts one of the internal counters above. The fast path's hits and
/// frees move bytes between the caches and use in one pending pair per shard (owned_cache_hit,
/// owned_cache_free), which current() and the flushes count for three gauges. A gauge has a
/// high-water mark. Each shard accumulates its changes and flushes them to the gauge's total once
/// they exceed the gauge's threshold either way, where the peak is raised. current() is exact;
/// the peak read may miss a rise shorter than the unflushed amounts (at most the threshold per
/// thread), and is never below the current value read with it (read_gauge). A flush of
/// bytes_in_use, allocations_in_use or bytes_cached flushes all three and the moves, so the
/// peaks of the count and the bytes are taken at the same moments. The thresholds are
/// constants, so that the fast path compares against an immediate, except bytes_held's, which a
/// hard limit sets to 0: a threshold of 0 makes every change exact (the graph gauges' too).
class stats {
  /// One thread shard's words: the counters, then the gauges' unflushed changes.
  struct alignas(64) shard {
    std::atomic<int64_t> value[stat::kCounters + stat::kGauges] = {};
    /// The fast path's unflushed moves: bytes taken from the caches into use (bytes_in_use
    /// gains them, bytes_cached loses them; negative for frees into the caches), and the
    /// allocations put in use with them (allocations_in_use).
    std::atomic<int64_t> moved_bytes{0};
    std::atomic<int64_t> moved_allocations{0};
  };
  /// A gauge's flushed total, its peak and (bytes_held only) its flush threshold, alone on a
  /// cache line.
  struct alignas(64) gauge_total {
    std::atomic<int64_t> value{0};
    std::atomic<int64_t> peak{0};
    std::atomic<int64_t> threshold{kByteFlush};
  };
  static_assert(alignof(shard) == 64 && sizeof(shard) % 64 == 0,
                "each thread's stats shard fills whole cache lines of its own");
  static_assert(alignof(gauge_total) == 64 && sizeof(gauge_total) == 64,
                "each gauge's total is alone on its cache line");

 public:
  /// Byte gauges flush per-thread changes beyond this many bytes (count gauges: 64).
  static constexpr int64_t kByteFlush = 1 << 20;
  static constexpr int64_t kCountFlush = 64;

  stats() noexcept;
  stats(const stats&) = delete;
  stats& operator=(const stats&) = delete;

  /// The calling thread's shard, looked up once for the updates of one operation. Valid on
  /// the thread that took it, while the stats live. `Owned`: the caller checked that the thread
  /// owns the shard, so that every update is a plain load and store with no test (the fast
  /// path's); otherwise each update tests it (see local and owned_local below).
  template <bool Owned>
  class basic_local {
   public:
    void count(stat::counter c, int64_t n = 1) noexcept {
      shard_add(shard_.value[c], n, exclusive());
    }
    void add(stat::gauge g, int64_t n) noexcept {
      gauge_total& total = owner_.totals_[g];
      // A threshold of 0 flushes every change before add returns: the total stays exact.
      const int64_t threshold = threshold_of(g, total);
      std::atomic<int64_t>& pending = shard_.value[stat::kCounters + g];
      int64_t v = n;
      if (exclusive()) {
        v += pending.load(std::memory_order_relaxed);
        pending.store(v, std::memory_order_relaxed);
      } else {
        v += pending.fetch_add(n, std::memory_order_relaxed);
      }
      // Outside [-threshold, threshold], in one unsigned comparison.
      if (static_cast<uint64_t>(v + threshold) > static_cast<uint64_t>(2 * threshold)) {
        flush_batch(g, total, pending);
      }
    }
    void sub(stat::gauge g, int64_t n) noexcept { add(g, -n); }

   private:
    friend class stats;
    /// The batch of gauge `g` is full: into its total. Out of line, off the fast path.
    [[gnu::noinline]] void flush_batch(stat::gauge g, gauge_total& total,
                                       std::atomic<int64_t>& pending) noexcept {
      if (in_use_gauge(g)) {
        owner_.flush_in_use(shard_);
      } else {
        flush(total, pending);
      }
    }
    basic_local(stats& owner, shard_slot slot) noexcept
        : owner_(owner), shard_(owner.shards_[slot.index]), exclusive_(Owned || slot.exclusive) {}
    bool exclusive() const noexcept { return Owned || exclusive_; }
    stats& owner_;
    shard& shard_;
    const bool exclusive_;
  };
  /// A shard whose ownership each update tests.
  using local = basic_local<false>;
  /// A shard the calling thread owns (shard_slot::exclusive).
  using owned_local = basic_local<true>;

  /// The calling thread's shard.
  local here() noexcept { return local(*this, thread_shard()); }
  /// The calling thread's shard by its slot, looked up by the caller (thread_shard()).
  local at(shard_slot slot) noexcept { return local(*this, slot); }
  /// The same, for a slot the thread owns (`slot.exclusive`, checked by the caller).
  owned_local owned_at(shard_slot slot) noexcept { return owned_local(*this, slot); }

  /// The fast path's cache hit of `bytes`, through shard `index`, which the calling thread owns
  /// (shard_slot::exclusive): counts the hit, and moves the bytes from bytes_cached into
  /// bytes_in_use with one more allocation in use. Three plain updates and one test.
  void owned_cache_hit(size_t index, int64_t bytes) noexcept {
    owned_move(shards_[index], stat::cache_hits, bytes, 1);
  }
  /// The fast path's deallocation whose block (`bytes`) its origin stream's cache kept, through
  /// shard `index` as owned_cache_hit: counts a fast free, and moves the bytes back.
  void owned_cache_free(size_t index, int64_t bytes) noexcept {
    owned_move(shards_[index], stat::fast_frees, -bytes, -1);
  }

  /// One update through the calling thread's shard (for code off the fast path).
  void count(stat::counter c, int64_t n = 1) noexcept { here().count(c, n); }
  void add(stat::gauge g, int64_t n) noexcept { here().add(g, n); }
  void sub(stat::gauge g, int64_t n) noexcept { here().add(g, -n); }

  /// Adds `n` to gauge `g` unless its exact total would exceed `limit` (bytes_held once exact),
  /// and sets `*total` to the total with it. The peak is left as it was: a reservation raises it
  /// once it is used (raise_peak), and is given back with sub when it is not.
  bool try_reserve(stat::gauge g, int64_t n, int64_t limit, int64_t* total) noexcept;
  /// Raises gauge `g`'s peak to `value` if it is below.
  void raise_peak(stat::gauge g, int64_t value) noexcept { raise_peak(totals_[g], value); }
  /// Makes bytes_held exact from now on (a hard limit): its flush threshold becomes 0.
  void make_bytes_held_exact() noexcept {
    totals_[stat::bytes_held].threshold.store(0, std::memory_order_relaxed);
  }

  /// A gauge's exact current value (once the updating threads are quiescent).
  int64_t current(stat::gauge g) const noexcept;
  /// A counter's sum, with the internal counters that count for it; exact once the updating
  /// threads are quiescent.
  int64_t sum(stat::counter c) const noexcept;

  /// Fills the C struct (whose struct_size and version the caller set) with these values and
  /// the pool's figures.
  void read(const pool_figures& pool, arcpool_stats_t* out) const;

  /// Resets every peak to its current value.
  void reset_peaks() noexcept;

 private:
  /// Gauge `g`'s current value and peak, as read() reports them.
  void read_gauge(stat::gauge g, uint64_t* current_out, uint64_t* peak_out) const noexcept;
  /// The gauges the fast path's moves count for, flushed together (flush_in_use).
  static constexpr bool in_use_gauge(stat::gauge g) noexcept {
    return g == stat::bytes_in_use || g == stat::allocations_in_use || g == stat::bytes_cached;
  }
  /// owned_cache_hit and owned_cache_free: counter `c`, and `bytes` and `allocations` more moved
  /// into use.
  void owned_move(shard& s, stat::counter c, int64_t bytes, int64_t allocations) noexcept {
    s.value[c].store(s.value[c].load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    const int64_t b = s.moved_bytes.load(std::memory_order_relaxed) + bytes;
    s.moved_bytes.store(b, std::memory_order_relaxed);
    const int64_t n = s.moved_allocations.load(std::memory_order_relaxed) + allocations;
    s.moved_allocations.store(n, std::memory_order_relaxed);
    // Either outside [-threshold, threshold]: one branch for both.
    if ((static_cast<uint64_t>(b + kByteFlush) > static_cast<uint64_t>(2 * kByteFlush)) |
        (static_cast<uint64_t>(n + kCountFlush) > static_cast<uint64_t>(2 * kCountFlush))) {
      flush_in_use(s);
    }
  }
  /// Shard `s`'s unflushed changes of the three in_use_gauge gauges, its moves among them, into
  /// their totals together, the allocation count first (as allocate adds it), each peak raised:
  /// a flush never leaves one of the words that change a gauge behind, so that a total is
  /// exact at a flush with one thread (no peak from half of a move). Out of line.
  [[gnu::noinline]] void flush_in_use(shard& s) noexcept;
  /// The shards' unflushed moves that count for gauge `g` (0 for the others).
  int64_t moved(stat::gauge g) const noexcept;

  /// Gauge `g`'s flush threshold: a constant (folded where `g` is), bytes_held's from `total`.
  static int64_t threshold_of(stat::gauge g, const gauge_total& total) noexcept {
    switch (g) {
      case stat::bytes_in_use:
      case stat::bytes_pending_free:
      case stat::bytes_cached:
        return kByteFlush;
      case stat::allocations_in_use:
        return kCountFlush;
      case stat::bytes_held:
        return total.threshold.load(std::memory_order_relaxed);
      default:
        return 0;
    }
  }
  /// The shards' sum of `c` alone.
  int64_t raw_sum(stat::counter c) const noexcept;
  static void raise_peak(gauge_total& total, int64_t now) noexcept {
    int64_t p = total.peak.load(std::memory_order_relaxed);
    while (now > p && !total.peak.compare_exchange_weak(p, now, std::memory_order_relaxed)) {
    }
  }
  static void flush(gauge_total& total, std::atomic<int64_t>& pending) noexcept {
    const int64_t taken = pending.exchange(0, std::memory_order_relaxed);
    raise_peak(total, total.value.fetch_add(taken, std::memory_order_relaxed) + taken);
  }

  shard shards_[kShards];
  gauge_total totals_[stat::kGauges];
};

/// The C struct as one JSON object, with the per-stream rows as its "streams" array.
std::string stats_to_json(const arcpool_stats_t& s,
                          const std::vector<arcpool_stream_stats_t>& streams);

}  // namespace arcpool::detail
