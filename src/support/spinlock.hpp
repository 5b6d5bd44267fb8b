// Spinlocks for short critical sections that are almost never contended: a test-and-test-and-set
// lock (a stream's block cache is used by the threads feeding that stream) and a reader-writer
// lock (a stream's liveness: every enqueue on it reads, its retirement writes once).
#pragma once

#include <atomic>
#include <cstdint>
#include <thread>

namespace arcpool::detail {

class spinlock {
 public:
  void lock() noexcept {
    while (locked_.exchange(true, std::memory_order_acquire)) {
      while (locked_.load(std::memory_order_relaxed))
        std::this_thread::yield();
    }
  }
  void unlock() noexcept { locked_.store(false, std::memory_order_release); }

 private:
  std::atomic<bool> locked_{false};
};

/// A reader-writer spinlock (SharedMutex: std::shared_lock and std::unique_lock take it). Readers
/// are preferred, as by glibc's default pthread_rwlock under std::shared_mutex: a reader waits
/// only while a writer holds the lock, never for one that waits, so a thread may hold it shared
/// twice. The writer waits until no reader holds it.
class shared_spinlock {
 public:
  void lock_shared() noexcept {
    uint32_t s = state_.load(std::memory_order_relaxed);
    for (;;) {
      if (s & kWriter) {
        std::this_thread::yield();
        s = state_.load(std::memory_order_relaxed);
      } else if (state_.compare_exchange_weak(s, s + 1, std::memory_order_acquire,
                                              std::memory_order_relaxed)) {
        return;
      }
    }
  }
  void unlock_shared() noexcept { state_.fetch_sub(1, std::memory_order_release); }
  void lock() noexcept {
    uint32_t expected = 0;
    while (!state_.compare_exchange_weak(expected, kWriter, std::memory_order_acquire,
                                         std::memory_order_relaxed)) {
      expected = 0;
      std::this_thread::yield();
    }
  }
  void unlock() noexcept { state_.store(0, std::memory_order_release); }

 private:
  static constexpr uint32_t kWriter = uint32_t{1} << 31;
  std::atomic<uint32_t> state_{0};  ///< readers holding it, or kWriter
};

}  // namespace arcpool::detail
