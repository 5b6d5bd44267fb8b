// A test-and-test-and-set spinlock for short critical sections that are almost never contended
// (a stream's block cache is used by the threads feeding that stream).
#pragma once

#include <atomic>
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

}  // namespace arcpool::detail
