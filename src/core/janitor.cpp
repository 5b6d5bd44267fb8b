#include "core/janitor.hpp"

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

#include "core/allocator.hpp"

namespace arcpool::detail {
namespace {

class janitor {
 public:
  void adopt(allocator* a) {
    std::lock_guard<std::mutex> lock(mutex_);
    closing_.push_back(a);
    if (!worker_.joinable() && !stopped_) {
      worker_ = std::thread([this] { run(); });
      std::atexit([] { instance().stop(); });
    }
    cv_.notify_one();
  }

  void wake() noexcept { cv_.notify_one(); }

  static janitor& instance() {
    static auto* j = new janitor();  // leaked: allocators may close during static destruction
    return *j;
  }

 private:
  // Deletes every quiescent allocator; returns whether any is left.
  bool sweep(std::unique_lock<std::mutex>& lock) {
    std::vector<allocator*> done;
    for (size_t i = 0; i < closing_.size();) {
      if (closing_[i]->quiescent()) {
        done.push_back(closing_[i]);
        closing_[i] = closing_.back();
        closing_.pop_back();
      } else {
        ++i;
      }
    }
    lock.unlock();
    for (allocator* a : done)
      allocator::destroy(a);
    lock.lock();
    return !closing_.empty();
  }

  void run() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stopped_) {
      if (sweep(lock)) {
        cv_.wait_for(lock, std::chrono::milliseconds(5));
      } else {
        cv_.wait(lock, [&] { return stopped_ || !closing_.empty(); });
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
  std::vector<allocator*> closing_;
  std::thread worker_;
  bool stopped_ = false;
};

}  // namespace

void janitor_adopt(allocator* a) {
  janitor::instance().adopt(a);
}

void janitor_wake() noexcept {
  janitor::instance().wake();
}

}  // namespace arcpool::detail
