#include <atomic>
#include <condition_variable>
#include <mutex>

#include "core/allocator.hpp"
#include "drivers/deterministic.hpp"
#include "drivers/host_stream.hpp"
#include "support/stream_probe.hpp"

namespace arcpool::test {
namespace {

struct latch_state {
  std::mutex mutex;
  std::condition_variable cv;
  bool open = false;
};

class host_gate final : public gate {
 public:
  explicit host_gate(std::shared_ptr<latch_state> state) : state_(std::move(state)) {}
  ~host_gate() override { open(); }
  void open() override {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->open = true;
    state_->cv.notify_all();
  }

 private:
  std::shared_ptr<latch_state> state_;
};

class host_marker final : public marker {
 public:
  bool reached() const override { return flag.load(); }
  std::atomic<bool> flag{false};
};

class host_probe final : public stream_probe {
 public:
  explicit host_probe(arcpool_allocator_t* allocator) : allocator_(allocator) {}

  std::unique_ptr<gate> block(arcpool_stream_t s) override {
    auto state = std::make_shared<latch_state>();
    // The host work owns a reference, so the latch outlives the gate if need be.
    auto* held = new std::shared_ptr<latch_state>(state);
    arcpool_stream_launch_host_func(
        allocator_, s,
        [](void* p) {
          auto* st = static_cast<std::shared_ptr<latch_state>*>(p);
          {
            std::unique_lock<std::mutex> lock((*st)->mutex);
            // Blocked until the test opens the latch (settle waits a latch already opened out).
            detail::host_work_blocking blocking({}, [state = *st] {
              std::lock_guard<std::mutex> guard(state->mutex);
              return state->open;
            });
            (*st)->cv.wait(lock, [&] { return (*st)->open; });
          }
          delete st;
        },
        held);
    return std::make_unique<host_gate>(std::move(state));
  }

  std::shared_ptr<marker> mark(arcpool_stream_t s) override {
    auto m = std::make_shared<host_marker>();
    auto* held = new std::shared_ptr<host_marker>(m);
    arcpool_stream_launch_host_func(
        allocator_, s,
        [](void* p) {
          auto* mk = static_cast<std::shared_ptr<host_marker>*>(p);
          (*mk)->flag.store(true);
          delete mk;
        },
        held);
    return m;
  }

 private:
  arcpool_allocator_t* allocator_;
};

/// A latch of the deterministic driver: the scheduler runs nothing behind it while closed.
class deterministic_gate final : public gate {
 public:
  explicit deterministic_gate(std::shared_ptr<std::atomic<bool>> open) : open_(std::move(open)) {}
  ~deterministic_gate() override { open(); }
  void open() override { open_->store(true); }

 private:
  std::shared_ptr<std::atomic<bool>> open_;
};

class deterministic_probe final : public stream_probe {
 public:
  explicit deterministic_probe(arcpool_allocator_t* allocator)
      : allocator_(allocator), markers_(allocator) {}

  std::unique_ptr<gate> block(arcpool_stream_t s) override {
    auto open = std::make_shared<std::atomic<bool>>(false);
    detail::deterministic::hold(detail::from_handle(allocator_)->drv(), s, open);
    return std::make_unique<deterministic_gate>(std::move(open));
  }

  // Markers are plain host work: the scheduler runs it in stream order, on the test's thread.
  std::shared_ptr<marker> mark(arcpool_stream_t s) override { return markers_.mark(s); }

 private:
  arcpool_allocator_t* allocator_;
  host_probe markers_;
};

}  // namespace

std::unique_ptr<stream_probe> make_host_probe(arcpool_allocator_t* allocator) {
  return std::make_unique<host_probe>(allocator);
}

std::unique_ptr<stream_probe> make_deterministic_probe(arcpool_allocator_t* allocator) {
  return std::make_unique<deterministic_probe>(allocator);
}

}  // namespace arcpool::test
