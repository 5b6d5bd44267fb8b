// Per-thread shards: counters and gauges that threads update without contending, summed on
// read (design.md §7: no global lock or shared counter on the hot path).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace arcpool::detail {

/// Number of shards. Each of the first kShards live threads owns one exclusively (its updates
/// are a plain load and store); threads beyond that share the last one (atomic add).
inline constexpr size_t kShards = 64;

/// The calling thread's shard: its index, and whether it owns it alone.
struct shard_slot {
  size_t index;
  bool exclusive;
};

/// The calling thread's slot once assigned (constant-initialized: reading it is one TLS load).
inline thread_local shard_slot t_shard_slot{SIZE_MAX, false};

/// Assigns the calling thread's slot (first use).
shard_slot assign_thread_shard() noexcept;

inline shard_slot thread_shard() noexcept {
  const shard_slot s = t_shard_slot;
  return s.index != SIZE_MAX ? s : assign_thread_shard();
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
  void add(int64_t n = 1) noexcept {
    const shard_slot s = thread_shard();
    shard_add(shards_[s.index].value, n, s.exclusive);
  }
  /// Adds with release order: the caller's earlier writes happen before a sum_acquire that
  /// sees this change.
  void add_release(int64_t n) noexcept {
    const shard_slot s = thread_shard();
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

/// A gauge with a high-water mark. Each shard accumulates its changes and flushes them to the
/// total once they exceed `flush_threshold` either way, where the peak is raised. current() is
/// exact; peak() may miss a rise shorter than the unflushed amounts (at most flush_threshold
/// per thread). A threshold of 0 makes every change exact (used under a hard limit).
class sharded_gauge {
 public:
  explicit sharded_gauge(int64_t flush_threshold = 0) : threshold_(flush_threshold) {}

  void set_flush_threshold(int64_t t) noexcept { threshold_.store(t, std::memory_order_relaxed); }

  void add(int64_t n) noexcept {
    const int64_t threshold = threshold_.load(std::memory_order_relaxed);
    if (threshold == 0) {
      raise_peak(total_.fetch_add(n, std::memory_order_relaxed) + n);
      return;
    }
    const shard_slot s = thread_shard();
    auto& pending = pending_[s.index].value;
    shard_add(pending, n, s.exclusive);
    const int64_t v = pending.load(std::memory_order_relaxed);
    if (v > threshold || v < -threshold) {
      const int64_t taken = pending.exchange(0, std::memory_order_relaxed);
      raise_peak(total_.fetch_add(taken, std::memory_order_relaxed) + taken);
    }
  }
  void sub(int64_t n) noexcept { add(-n); }

  /// Adds `n` unless the exact total would exceed `limit` (threshold 0 only).
  bool try_add(int64_t n, int64_t limit) noexcept {
    int64_t now = total_.load(std::memory_order_relaxed);
    do {
      if (n > limit || now > limit - n) return false;
    } while (!total_.compare_exchange_weak(now, now + n, std::memory_order_relaxed));
    raise_peak(now + n);
    return true;
  }

  int64_t current() const noexcept {
    int64_t total = total_.load(std::memory_order_relaxed);
    for (const auto& p : pending_)
      total += p.value.load(std::memory_order_relaxed);
    return total;
  }
  int64_t peak() const noexcept {
    const int64_t now = current();
    const int64_t p = peak_.load(std::memory_order_relaxed);
    return p > now ? p : now;
  }
  void reset_peak() noexcept { peak_.store(current(), std::memory_order_relaxed); }

 private:
  void raise_peak(int64_t now) noexcept {
    int64_t p = peak_.load(std::memory_order_relaxed);
    while (now > p && !peak_.compare_exchange_weak(p, now, std::memory_order_relaxed)) {
    }
  }

  std::atomic<int64_t> threshold_;
  padded<std::atomic<int64_t>> pending_[kShards];
  alignas(64) std::atomic<int64_t> total_{0};
  std::atomic<int64_t> peak_{0};
};

}  // namespace arcpool::detail
