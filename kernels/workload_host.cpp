// The host-driver workload: fill / verify / poison / spin as stream-ordered host work.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#include "pattern.hpp"
#include "workload.hpp"

namespace arcpool::kernels {
namespace {

#define ARCPOOL_WORKLOAD_RETURN_IF_ERROR(expr)                                                \
  do {                                                                                        \
    if (arcpool_status_t status_ = (expr); status_ != ARCPOOL_STATUS_SUCCESS) return status_; \
  } while (0)

class host_workload final : public workload {
 public:
  explicit host_workload(arcpool_allocator_t* allocator) : allocator_(allocator) {}

  arcpool_driver_kind_t driver() const override { return ARCPOOL_DRIVER_HOST; }

  arcpool_status_t fill(void* p, size_t bytes, uint64_t tag, uint64_t first_word,
                        arcpool_stream_t s) override {
    return enqueue(s, [p, bytes, tag, first_word] {
      auto* words = static_cast<uint32_t*>(p);
      const uint32_t t = tag_word(tag);
      for (size_t i = 0; i < bytes / 4; ++i)
        words[i] = pattern_word(t, first_word + i);
    });
  }

  arcpool_status_t verify(const void* p, size_t bytes, uint64_t tag, uint64_t first_word,
                          arcpool_stream_t s) override {
    return enqueue(s, [this, p, bytes, tag, first_word] {
      const auto* words = static_cast<const uint32_t*>(p);
      const uint32_t t = tag_word(tag);
      uint64_t bad = 0;
      for (size_t i = 0; i < bytes / 4; ++i)
        bad += words[i] != pattern_word(t, first_word + i);
      mismatches_.fetch_add(bad, std::memory_order_relaxed);
      words_.fetch_add(bytes / 4, std::memory_order_relaxed);
    });
  }

  arcpool_status_t poison(void* p, size_t bytes, arcpool_stream_t s) override {
    return enqueue(s, [p, bytes] {
      auto* words = static_cast<uint32_t*>(p);
      for (size_t i = 0; i < bytes / 4; ++i)
        words[i] = kPoisonWord;
    });
  }

  arcpool_status_t spin(uint64_t nanoseconds, arcpool_stream_t s) override {
    return enqueue(s, [nanoseconds] {
      const auto until = std::chrono::steady_clock::now() + std::chrono::nanoseconds(nanoseconds);
      while (std::chrono::steady_clock::now() < until)
        std::this_thread::yield();
    });
  }

  arcpool_status_t wait_stream(arcpool_stream_t waiter, arcpool_stream_t target) override {
    // A latch the target opens when it reaches this point and the waiter waits on.
    struct latch {
      std::mutex mutex;
      std::condition_variable cv;
      bool open = false;
    };
    auto shared = std::make_shared<latch>();
    ARCPOOL_WORKLOAD_RETURN_IF_ERROR(enqueue(target, [shared] {
      std::lock_guard<std::mutex> lock(shared->mutex);
      shared->open = true;
      shared->cv.notify_all();
    }));
    return enqueue(waiter, [shared] {
      std::unique_lock<std::mutex> lock(shared->mutex);
      shared->cv.wait(lock, [&] { return shared->open; });
    });
  }

  void* foreign_allocate(size_t bytes) override {
    return std::aligned_alloc(256, (bytes + 255) / 256 * 256);
  }

  uint64_t mismatches() override { return mismatches_.load(); }
  uint64_t verified_words() override { return words_.load(); }

 protected:
  void release_foreign(void* pointer, size_t) override { std::free(pointer); }

 private:
  template <class F>
  arcpool_status_t enqueue(arcpool_stream_t s, F work) {
    auto* task = new F(std::move(work));
    const arcpool_status_t status = arcpool_stream_launch_host_func(
        allocator_, s,
        [](void* p) {
          auto* t = static_cast<F*>(p);
          (*t)();
          delete t;
        },
        task);
    if (status != ARCPOOL_STATUS_SUCCESS) delete task;
    return status;
  }

  arcpool_allocator_t* const allocator_;
  std::atomic<uint64_t> mismatches_{0};
  std::atomic<uint64_t> words_{0};
};

}  // namespace

void workload::poison_before_free(void* pointer, size_t bytes, arcpool_stream_t stream,
                                  void* user_data) {
  static_cast<workload*>(user_data)->poison(pointer, bytes, stream);
}

void workload::foreign_free(void* pointer, size_t bytes, void* user_data) {
  static_cast<workload*>(user_data)->release_foreign(pointer, bytes);
}

std::unique_ptr<workload> make_host_workload(arcpool_allocator_t* allocator) {
  return std::make_unique<host_workload>(allocator);
}

std::unique_ptr<workload> make_workload(arcpool_allocator_t* allocator) {
  if (arcpool_allocator_driver(allocator) == ARCPOOL_DRIVER_HOST) {
    return make_host_workload(allocator);
  }
  return make_cuda_workload();
}

}  // namespace arcpool::kernels
