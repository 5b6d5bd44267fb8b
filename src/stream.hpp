// Stream identity and liveness (DESIGN.md §6).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <unordered_map>

#include "drivers/driver.hpp"
#include "fence.hpp"

namespace arcpool::detail {

/// A stream arcpool can prove alive: created by arcpool, or registered by the application.
/// While `alive`, arcpool may enqueue on it at any time; retiring it (destroy, unregister)
/// first records a final fence covering everything queued on it so far.
class stream_entry {
 public:
  stream_entry(stream_handle handle, uint64_t id, bool created)
      : handle_(handle), id_(id), created_(created) {}

  stream_handle handle() const noexcept { return handle_; }
  uint64_t id() const noexcept { return id_; }
  /// True for streams made by arcpool_stream_create.
  bool created() const noexcept { return created_; }

  /// Runs `fn(handle)` while the stream is provably alive (retirement waits for it) and returns
  /// its status; returns `dead_status` without running it once retired.
  template <class F>
  arcpool_status_t with_alive(F&& fn, arcpool_status_t dead_status) {
    std::shared_lock<std::shared_mutex> lock(mutex_);
    if (!alive_) return dead_status;
    return fn(handle_);
  }

  /// True until retired.
  bool alive() {
    std::shared_lock<std::shared_mutex> lock(mutex_);
    return alive_;
  }

  /// Retires the stream: records `final_fence` on it first (waiting for in-flight enqueues),
  /// after which arcpool never touches it again.
  arcpool_status_t retire(event_pool& events);

  /// The fence recorded at retirement (null while alive).
  fence_ref final_fence() {
    std::shared_lock<std::shared_mutex> lock(mutex_);
    return final_;
  }

 private:
  const stream_handle handle_;
  const uint64_t id_;
  const bool created_;
  std::shared_mutex mutex_;
  bool alive_ = true;
  fence_ref final_;
};

/// What kind of stream a handle names.
enum class stream_kind : uint8_t {
  application,         ///< any other stream, alive only as the CUDA contract says
  legacy_default,      ///< NULL or cudaStreamLegacy: enqueued on only when the caller passed it
  per_thread_default,  ///< cudaStreamPerThread: a different stream on every thread
};

/// A stream as an allocation remembers it: handle, identity and, when arcpool can prove it
/// alive, its registry entry.
struct stream_ref {
  stream_handle handle = nullptr;
  uint64_t id = 0;
  stream_kind kind = stream_kind::application;
  std::shared_ptr<stream_entry> entry;  ///< null unless created or registered

  /// True if arcpool may enqueue on it from any call (created or registered, not retired).
  bool provably_alive() const { return entry && entry->alive(); }
  /// True if it was created or registered and has since been retired.
  bool retired() const { return entry && !entry->alive(); }
};

/// The created and registered streams of one allocator, by identity.
class stream_registry {
 public:
  std::shared_ptr<stream_entry> find(uint64_t id) const {
    std::shared_lock<std::shared_mutex> lock(mutex_);
    auto it = entries_.find(id);
    return it == entries_.end() ? nullptr : it->second;
  }

  /// Adds `entry`; returns false if its identity is already present.
  bool add(std::shared_ptr<stream_entry> entry) {
    std::unique_lock<std::shared_mutex> lock(mutex_);
    return entries_.emplace(entry->id(), std::move(entry)).second;
  }

  /// Removes and returns the entry of `id` (null if absent).
  std::shared_ptr<stream_entry> remove(uint64_t id) {
    std::unique_lock<std::shared_mutex> lock(mutex_);
    auto it = entries_.find(id);
    if (it == entries_.end()) return nullptr;
    auto entry = std::move(it->second);
    entries_.erase(it);
    return entry;
  }

  /// Removes and returns every entry.
  std::unordered_map<uint64_t, std::shared_ptr<stream_entry>> take_all() {
    std::unique_lock<std::shared_mutex> lock(mutex_);
    return std::move(entries_);
  }

 private:
  mutable std::shared_mutex mutex_;
  std::unordered_map<uint64_t, std::shared_ptr<stream_entry>> entries_;
};

}  // namespace arcpool::detail
