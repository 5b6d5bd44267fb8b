// Stream identity and liveness (design.md §6).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <unordered_map>
#include <vector>

#include "core/block_cache.hpp"
#include "core/fence.hpp"
#include "drivers/driver.hpp"
#include "observe/stream_stats.hpp"
#include "support/spinlock.hpp"
#include "support/thread_state.hpp"

namespace arcpool::detail {

/// A stream arcpool can prove alive: created by arcpool, or registered by the application.
/// While `alive`, arcpool may enqueue on it at any time; retiring it (destroy, unregister)
/// first records a final fence covering everything queued on it so far.
class stream_entry {
 public:
  /// An entry without a statistics row: it takes one when the registry adds it (take_row).
  stream_entry(stream_handle handle, uint64_t id, bool created)
      : handle_(handle), id_(id), created_(created) {}

  stream_handle handle() const noexcept { return handle_; }
  uint64_t id() const noexcept { return id_; }
  /// True for streams made by arcpool_stream_create.
  bool created() const noexcept { return created_; }
  /// The statistics row its allocations count on (design.md §11).
  stream_stats& stats() const noexcept { return *stats_; }
  /// Takes the stream's statistics row from `rows`: its own, guarded by its cache's lock, or the
  /// other-streams row once every row is taken. Called once, by stream_registry::add when the
  /// entry joins the registry (before any other thread can find it), so that an entry that lost
  /// a registration race leaves no row behind.
  void take_row(stream_stats_table& rows) noexcept {
    stats_ = rows.take(handle_, id_, cache_.guard());
  }

  /// Runs `fn(handle)` while the stream is provably alive (retirement waits for it) and returns
  /// its status; returns nullopt without running it once retired (no status of `fn` can be
  /// mistaken for retirement).
  template <class F>
  std::optional<arcpool_status_t> with_alive(F&& fn) {
    std::shared_lock<shared_spinlock> lock(mutex_);
    if (!alive_.load(std::memory_order_relaxed)) return std::nullopt;
    return fn(handle_);
  }

  /// True until retired. Lock-free: enqueueing still goes through with_alive.
  bool alive() const noexcept { return alive_.load(std::memory_order_acquire); }

  /// Claims the stream's retirement (destroy, unregister) for the calling call: false when
  /// another call holds the claim or retired the stream, so that of calls racing to retire it
  /// one goes on (and destroys the stream once).
  bool claim_retirement() noexcept { return !retiring_.exchange(true, std::memory_order_acq_rel); }
  /// Gives the claim back: the retirement failed, the stream stays.
  void give_retirement_back() noexcept { retiring_.store(false, std::memory_order_release); }

  /// Counts a registration beyond the one that made the entry (or, for a created stream, any):
  /// two components that each register a stream, a framework's capture wrapper and the
  /// application, each withdraw their own.
  void add_registration() noexcept { extra_registrations_.fetch_add(1, std::memory_order_relaxed); }
  /// Withdraws one counted registration: false when none is left (an unregister then retires a
  /// registered stream, and is refused for a created one).
  bool withdraw_registration() noexcept {
    uint32_t n = extra_registrations_.load(std::memory_order_relaxed);
    while (n != 0 &&
           !extra_registrations_.compare_exchange_weak(n, n - 1, std::memory_order_relaxed)) {
    }
    return n != 0;
  }

  /// Retires the stream: records `final_fence` on it first (waiting for in-flight enqueues),
  /// after which arcpool never touches it again.
  arcpool_status_t retire(event_pool& events);

  /// Blocks freed on this stream, kept for its later allocations (the fast path).
  block_cache& cache() noexcept { return cache_; }

  /// The fence recorded at retirement (null while alive).
  fence_ref final_fence() {
    std::shared_lock<shared_spinlock> lock(mutex_);
    return final_;
  }

 private:
  /// First, so that it exists when the statistics row is taken under its guard.
  block_cache cache_;
  const stream_handle handle_;
  const uint64_t id_;
  const bool created_;
  stream_stats* stats_ = nullptr;  ///< set by take_row, under the registry's lock
  /// Held shared by every enqueue while alive, exclusively by retirement (a pthread rwlock pair
  /// cost transfer about 60 instructions under callgrind).
  shared_spinlock mutex_;
  std::atomic<bool> alive_{true};
  std::atomic<bool> retiring_{false};  ///< a call claimed the retirement (claim_retirement)
  std::atomic<uint32_t> extra_registrations_{0};  ///< add_registration's count
  fence_ref final_;
};

/// What kind of stream a handle names.
enum class stream_kind : uint8_t {
  application,         ///< any other stream, alive only as the CUDA contract says
  legacy_default,      ///< NULL or cudaStreamLegacy: enqueued on only when the caller passed it
  per_thread_default,  ///< cudaStreamPerThread: a different stream on every thread
};

/// A process-unique number for the calling thread (never reused, unlike a thread id).
uint64_t this_thread_serial() noexcept;

/// A stream as an allocation remembers it: handle, identity and, when arcpool can prove it
/// alive, its registry entry (stable until the allocator's teardown, see stream_registry).
struct stream_ref {
  stream_handle handle = nullptr;
  uint64_t id = 0;
  stream_kind kind = stream_kind::application;
  stream_entry* entry = nullptr;  ///< null unless created or registered
  /// A per-thread default stream: this_thread_serial() of the thread that named it, the only
  /// thread on which its handle names it (0 for every other kind).
  uint64_t thread = 0;

  /// True if arcpool may enqueue on it from any call (created or registered, not retired).
  bool provably_alive() const { return entry && entry->alive(); }
  /// True if it was created or registered and has since been retired.
  bool retired() const { return entry && !entry->alive(); }
  /// False for another thread's per-thread default stream: its handle names the calling
  /// thread's own stream here, so arcpool never enqueues on it or queries it (design.md §6).
  bool reachable() const {
    return kind != stream_kind::per_thread_default || thread == this_thread_serial();
  }
  /// True for a stream arcpool neither created nor registered, named while it captured into a
  /// capture bound to a graph pool: its identity is capture_scoped_id(handle).
  bool capture_scoped() const { return entry == nullptr && (id & kCaptureScopedBit) != 0; }

  /// The bit that marks a capture-scoped identity. Assumed absent from cudaStreamGetId's
  /// answers (documented only as unique in the process; simcuda and the host drivers count
  /// streams from 1).
  static constexpr uint64_t kCaptureScopedBit = uint64_t{1} << 63;
};

/// The identity of a stream arcpool neither created nor registered while it captures into a
/// capture bound to one of the allocator's graph pools (docs/graphs.md, "Streams a capture forks
/// to"): its handle, marked. arcpool does not ask cudaStreamGetId during a capture; the handle
/// names one stream for as long as that stream captures (a forked stream is joined back before
/// the capture ends, and the application does not destroy a stream it passes while it
/// captures), which is all a graph pool's tags need.
inline uint64_t capture_scoped_id(stream_handle s) noexcept {
  return stream_ref::kCaptureScopedBit | static_cast<uint64_t>(reinterpret_cast<uintptr_t>(s));
}

/// The calling thread's line for `s` (its stream lookups are part of its thread_state).
inline stream_cache_line& stream_cache_line_of(stream_handle s) noexcept {
  return this_thread_state().stream_line(s);
}

/// The created and registered streams of one allocator, by identity. An entry removed from the
/// registry (its stream retired) stays allocated until the registry is destroyed, so that
/// allocations can name it by a plain pointer with no reference count; each created or
/// registered stream costs one entry (under 128 bytes) for the allocator's life.
class stream_registry {
 public:
  /// The entry of `id`, or null.
  stream_entry* find(uint64_t id) const {
    std::shared_lock<std::shared_mutex> lock(mutex_);
    auto it = entries_.find(id);
    return it == entries_.end() ? nullptr : it->second.get();
  }

  /// Adds `entry`, which takes its statistics row from `rows`; returns false if its identity
  /// is already present (a registration racing another), and then `entry` is destroyed with no
  /// row taken and the present entry counts one more registration (add_registration). Makes the
  /// graveyard's room for it first: std::bad_alloc, nothing added, if the host has no memory.
  bool add(std::unique_ptr<stream_entry> entry, stream_stats_table& rows) {
    std::unique_lock<std::shared_mutex> lock(mutex_);
    const size_t room = entries_.size() + graveyard_.size() + 1;
    if (graveyard_.capacity() < room) graveyard_.reserve(std::max(room, 2 * graveyard_.capacity()));
    const auto [it, added] = entries_.try_emplace(entry->id(), std::move(entry));
    if (!added) {  // try_emplace left `entry` unmoved: no one saw it
      it->second->add_registration();
      return false;
    }
    it->second->take_row(rows);
    stamp_.store(next_stamp(), std::memory_order_release);
    return true;
  }

  /// Removes the entry of `id` (kept alive in the graveyard, whose room add made); returns
  /// whether it was present. Allocates nothing: it follows the stream's retirement, which
  /// cannot be undone.
  bool remove(uint64_t id) noexcept {
    std::unique_lock<std::shared_mutex> lock(mutex_);
    auto it = entries_.find(id);
    if (it == entries_.end()) return false;
    graveyard_.push_back(std::move(it->second));
    entries_.erase(it);
    stamp_.store(next_stamp(), std::memory_order_release);
    return true;
  }

  /// Calls `fn(entry)` for every present entry.
  template <class F>
  void for_each(F&& fn) const {
    std::shared_lock<std::shared_mutex> lock(mutex_);
    for (const auto& [id, entry] : entries_)
      fn(*entry);
  }

  /// Changes whenever an entry is added or removed, to a value no registry of the process had
  /// before (an address may be reused by a later registry; a stamp may not): a lookup cached
  /// under one stamp is valid for this registry while its stamp is unchanged, and one compare
  /// tells both.
  uint64_t stamp() const noexcept { return stamp_.load(std::memory_order_acquire); }

 private:
  mutable std::shared_mutex mutex_;
  std::unordered_map<uint64_t, std::unique_ptr<stream_entry>> entries_;
  /// Entries removed; room for every entry ever added.
  std::vector<std::unique_ptr<stream_entry>> graveyard_;
  std::atomic<uint64_t> stamp_{next_stamp()};

  static uint64_t next_stamp() noexcept {
    static std::atomic<uint64_t> next{1};
    return next.fetch_add(1, std::memory_order_relaxed);
  }
};

}  // namespace arcpool::detail
