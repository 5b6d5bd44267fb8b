#include "core/janitor.hpp"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <new>
#include <thread>

#include "core/allocator.hpp"

namespace arcpool::detail {
namespace {

class janitor {
 public:
  /// Holds `a` until it is quiescent. Allocates nothing: `a` is linked through itself. The
  /// worker starts at the first adoption; where it cannot (no host memory, no thread), a later
  /// adoption or wake starts it, and the process's exit sweeps in any case.
  void adopt(allocator* a) noexcept {
    std::lock_guard<std::mutex> lock(mutex_);
    a->janitor_link() = closing_;
    closing_ = a;
    if (!exit_hooked_) {
      exit_hooked_ = true;
      std::atexit([] { instance().stop(); });
    }
    start_locked();
    cv_.notify_one();
  }

  void wake() noexcept {
    if (!running_.load(std::memory_order_acquire)) {
      std::lock_guard<std::mutex> lock(mutex_);
      start_locked();
    }
    cv_.notify_one();
  }

  /// Made in static storage at the first use and never destroyed (allocators may close during
  /// static destruction); making it allocates nothing.
  static janitor& instance() noexcept {
    alignas(janitor) static unsigned char storage[sizeof(janitor)];
    static janitor* const j = new (storage) janitor();
    return *j;
  }

 private:
  void start_locked() noexcept {
    if (running_.load(std::memory_order_relaxed) || stopped_ || closing_ == nullptr) return;
    try {
      worker_ = std::thread([this] { run(); });
    } catch (const std::exception&) {
      return;  // no thread now (no host memory): a later adoption or wake tries again
    }
    running_.store(true, std::memory_order_release);
  }

  // Deletes every quiescent allocator; returns whether any is left.
  bool sweep(std::unique_lock<std::mutex>& lock) noexcept {
    allocator* done = nullptr;
    for (allocator** link = &closing_; *link != nullptr;) {
      allocator* a = *link;
      if (a->quiescent()) {
        *link = a->janitor_link();
        a->janitor_link() = done;
        done = a;
      } else {
        link = &a->janitor_link();
      }
    }
    lock.unlock();
    while (done != nullptr) {
      allocator* next = done->janitor_link();
      allocator::destroy(done);
      done = next;
    }
    lock.lock();
    return closing_ != nullptr;
  }

  void run() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stopped_) {
      if (sweep(lock)) {
        cv_.wait_for(lock, std::chrono::milliseconds(5));
      } else {
        cv_.wait(lock, [&] { return stopped_ || closing_ != nullptr; });
      }
    }
  }

  void stop() {
    std::unique_lock<std::mutex> lock(mutex_);
    stopped_ = true;
    cv_.notify_one();
    std::thread worker = std::move(worker_);
    lock.unlock();
    if (worker.joinable()) worker.join();
    lock.lock();
    sweep(lock);  // what is quiescent at exit goes now; the rest is the process's
  }

  std::mutex mutex_;
  std::condition_variable cv_;
  allocator* closing_ = nullptr;  ///< the allocators held, linked through janitor_link
  std::thread worker_;
  std::atomic<bool> running_{false};  ///< the worker started
  bool exit_hooked_ = false;
  bool stopped_ = false;
};

}  // namespace

void janitor_adopt(allocator* a) noexcept {
  janitor::instance().adopt(a);
}

void janitor_wake() noexcept {
  janitor::instance().wake();
}

}  // namespace arcpool::detail
