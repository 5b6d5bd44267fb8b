// The host driver: streams are worker threads, events are per-record completion markers, the
// pool hands out host memory and frees it when the free executes in stream order. A stand-in
// for machines without a GPU, so that ASan and TSan watch the whole model. Never a performance
// claim.
#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <mutex>

#include <sys/mman.h>

#include "drivers/driver.hpp"
#include "drivers/host_stream.hpp"
#include "support/status.hpp"

namespace arcpool::detail {
namespace {

/// Completion of one event record. Waits capture the marker current at the call, exactly as
/// cudaStreamWaitEvent captures the event's state.
class host_marker : public std::enable_shared_from_this<host_marker> {
 public:
  /// `recorder`: the stream whose queued work completes the marker.
  explicit host_marker(std::weak_ptr<host_stream> recorder) : recorder_(std::move(recorder)) {}

  void complete() {
    std::lock_guard<std::mutex> lock(mutex_);
    done_ = true;
    cv_.notify_all();
  }
  void wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    if (done_) return;
    // Lets tests see that the stream waits here, and on which stream.
    host_work_blocking blocking(recorder_, [self = shared_from_this()] { return self->done(); });
    cv_.wait(lock, [&] { return done_; });
  }
  bool done() {
    std::lock_guard<std::mutex> lock(mutex_);
    return done_;
  }

 private:
  const std::weak_ptr<host_stream> recorder_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false;
};

/// A host event: the marker of its most recent record (none: complete).
struct host_event {
  std::mutex mutex;
  std::shared_ptr<host_marker> last;

  std::shared_ptr<host_marker> current() {
    std::lock_guard<std::mutex> lock(mutex);
    return last;
  }
};

constexpr size_t kHostAlignment = 256;

class host_driver final : public driver {
 public:
  explicit host_driver(const driver_config& config)
      : device_(config.device),
        capacity_(config.host_capacity_bytes),
        reserve_only_(config.host_reserve_only) {}

  arcpool_driver_kind_t kind() const noexcept override { return ARCPOOL_DRIVER_HOST; }
  int device() const noexcept override { return device_; }

  arcpool_status_t stream_create(stream_handle* out) override {
    ARCPOOL_RETURN_IF_ERROR(check_not_in_host_work("stream_create"));
    *out = host_stream_create();
    return ARCPOOL_STATUS_SUCCESS;
  }

  arcpool_status_t stream_destroy(stream_handle s) override {
    ARCPOOL_RETURN_IF_ERROR(check_not_in_host_work("stream_destroy"));
    if (!host_stream_destroy(s)) {
      return fail(ARCPOOL_STATUS_INVALID_ARGUMENT, "stream %p is not a live host stream",
                  static_cast<void*>(s));
    }
    return ARCPOOL_STATUS_SUCCESS;
  }

  arcpool_status_t stream_synchronize(stream_handle s) override {
    std::shared_ptr<host_stream> hs;
    ARCPOOL_RETURN_IF_ERROR(resolve(s, "stream_synchronize", &hs));
    hs->synchronize();
    return ARCPOOL_STATUS_SUCCESS;
  }

  arcpool_status_t stream_id(stream_handle s, uint64_t* out) override {
    std::shared_ptr<host_stream> hs;
    ARCPOOL_RETURN_IF_ERROR(resolve(s, "stream_id", &hs));
    *out = hs->id();
    return ARCPOOL_STATUS_SUCCESS;
  }

  arcpool_status_t stream_is_capturing(stream_handle s, bool* out) override {
    std::shared_ptr<host_stream> hs;
    ARCPOOL_RETURN_IF_ERROR(resolve(s, "stream_is_capturing", &hs));
    *out = hs->capturing.load();
    return ARCPOOL_STATUS_SUCCESS;
  }

  arcpool_status_t stream_begin_capture(stream_handle s) override {
    std::shared_ptr<host_stream> hs;
    ARCPOOL_RETURN_IF_ERROR(resolve(s, "stream_begin_capture", &hs));
    if (hs->capturing.exchange(true)) {
      return fail(ARCPOOL_STATUS_INVALID_ARGUMENT, "stream %p is already capturing",
                  static_cast<void*>(s));
    }
    return ARCPOOL_STATUS_SUCCESS;
  }

  arcpool_status_t stream_end_capture(stream_handle s) override {
    std::shared_ptr<host_stream> hs;
    ARCPOOL_RETURN_IF_ERROR(resolve(s, "stream_end_capture", &hs));
    if (!hs->capturing.exchange(false)) {
      return fail(ARCPOOL_STATUS_INVALID_ARGUMENT, "stream %p is not capturing",
                  static_cast<void*>(s));
    }
    return ARCPOOL_STATUS_SUCCESS;
  }

  arcpool_status_t launch_host_func(stream_handle s, arcpool_host_fn_t fn,
                                    void* user_data) override {
    std::shared_ptr<host_stream> hs;
    ARCPOOL_RETURN_IF_ERROR(resolve_for_work(s, "launch_host_func", &hs));
    hs->enqueue([fn, user_data] { fn(user_data); });
    return ARCPOOL_STATUS_SUCCESS;
  }

  arcpool_status_t event_create(event_handle* out) override {
    ARCPOOL_RETURN_IF_ERROR(check_not_in_host_work("event_create"));
    *out = new host_event();
    return ARCPOOL_STATUS_SUCCESS;
  }

  void event_destroy(event_handle e) noexcept override { delete static_cast<host_event*>(e); }

  arcpool_status_t event_record(event_handle e, stream_handle s) override {
    std::shared_ptr<host_stream> hs;
    ARCPOOL_RETURN_IF_ERROR(resolve_for_work(s, "event_record", &hs));
    auto marker = std::make_shared<host_marker>(hs);
    // Queued before it is published: a record refused for host memory (a throw) leaves the
    // event as it was, as a failed cudaEventRecord does, not waiting for a marker never queued.
    hs->enqueue([marker] { marker->complete(); });
    auto* ev = static_cast<host_event*>(e);
    std::lock_guard<std::mutex> lock(ev->mutex);
    ev->last = std::move(marker);
    return ARCPOOL_STATUS_SUCCESS;
  }

  arcpool_status_t stream_wait_event(stream_handle s, event_handle e) override {
    std::shared_ptr<host_stream> hs;
    ARCPOOL_RETURN_IF_ERROR(resolve_for_work(s, "stream_wait_event", &hs));
    if (auto marker = static_cast<host_event*>(e)->current()) {
      hs->enqueue([marker] { marker->wait(); });
    }
    return ARCPOOL_STATUS_SUCCESS;
  }

  arcpool_status_t event_query(event_handle e, bool* done) override {
    ARCPOOL_RETURN_IF_ERROR(check_not_in_host_work("event_query"));
    auto marker = static_cast<host_event*>(e)->current();
    *done = !marker || marker->done();
    return ARCPOOL_STATUS_SUCCESS;
  }

  arcpool_status_t event_synchronize(event_handle e) override {
    ARCPOOL_RETURN_IF_ERROR(check_not_in_host_work("event_synchronize"));
    if (auto marker = static_cast<host_event*>(e)->current()) marker->wait();
    return ARCPOOL_STATUS_SUCCESS;
  }

  arcpool_status_t pool_allocate(size_t bytes, stream_handle s, void** out) override {
    std::shared_ptr<host_stream> hs;
    ARCPOOL_RETURN_IF_ERROR(resolve_for_work(s, "pool_allocate", &hs));
    const size_t rounded = round_up(bytes);
    if (rounded < bytes) {
      return fail(ARCPOOL_STATUS_OUT_OF_MEMORY, "%zu bytes exceed the address space", bytes);
    }
    // Memory freed earlier on this stream is reusable by this allocation in stream order, as
    // in a CUDA pool: when over capacity, let this stream's queued frees run, then retry once.
    uint64_t reserved = 0;
    if (!try_reserve(rounded, &reserved)) {
      hs->synchronize();
      if (!try_reserve(rounded, &reserved)) {
        return fail(ARCPOOL_STATUS_OUT_OF_MEMORY,
                    "host pool: %zu bytes requested, %llu of %zu bytes reserved", bytes,
                    static_cast<unsigned long long>(reserved), capacity_);
      }
    }
    void* p = reserve_only_ ? reserve(rounded) : std::aligned_alloc(kHostAlignment, rounded);
    if (p == nullptr) {
      counters_->reserved.fetch_sub(rounded);
      return fail(ARCPOOL_STATUS_OUT_OF_MEMORY, "host pool: aligned_alloc(%zu) failed", rounded);
    }
    update_peak(reserved + rounded);
    *out = p;
    return ARCPOOL_STATUS_SUCCESS;
  }

  arcpool_status_t pool_free(void* p, size_t bytes, stream_handle s) override {
    std::shared_ptr<host_stream> hs;
    ARCPOOL_RETURN_IF_ERROR(resolve_for_work(s, "pool_free", &hs));
    // The task owns a reference to the counters: it may run after the driver is gone.
    hs->enqueue([counters = counters_, p, rounded = round_up(bytes), reserved = reserve_only_] {
      if (reserved) {
        munmap(p, rounded);
      } else {
        std::free(p);
      }
      counters->reserved.fetch_sub(rounded);
    });
    return ARCPOOL_STATUS_SUCCESS;
  }

  arcpool_status_t pool_trim(size_t) override {
    return check_not_in_host_work("pool_trim");  // nothing cached: memory goes back at free
  }

  void pool_reset_peak() noexcept override { counters_->peak.store(counters_->reserved.load()); }

  pool_figures pool_query() override {
    pool_figures f;
    f.reserved_current = counters_->reserved.load();
    f.reserved_peak = counters_->peak.load();
    f.used_current = f.reserved_current;
    return f;
  }

  arcpool_status_t device_memory(size_t* out) override {
    ARCPOOL_RETURN_IF_ERROR(check_not_in_host_work("device_memory"));
    *out = capacity_;
    return ARCPOOL_STATUS_SUCCESS;
  }

  arcpool_status_t device_synchronize() override {
    ARCPOOL_RETURN_IF_ERROR(check_not_in_host_work("device_synchronize"));
    host_synchronize_all();
    return ARCPOOL_STATUS_SUCCESS;
  }

  void enter_reclaim_thread() noexcept override {}

  void inject_sticky_error() { sticky_error_.store(true); }

 private:
  static size_t round_up(size_t bytes) {
    return (std::max<size_t>(bytes, 1) + kHostAlignment - 1) & ~(kHostAlignment - 1);
  }

  /// Reserves `rounded` bytes of the simulated capacity; `*reserved` gets the total before.
  bool try_reserve(size_t rounded, uint64_t* reserved) {
    uint64_t now = counters_->reserved.load();
    do {
      *reserved = now;
      if (rounded > capacity_ || now > capacity_ - rounded) return false;
    } while (!counters_->reserved.compare_exchange_weak(now, now + rounded));
    return true;
  }

  void update_peak(uint64_t value) {
    uint64_t peak = counters_->peak.load();
    while (value > peak && !counters_->peak.compare_exchange_weak(peak, value)) {
    }
  }

  arcpool_status_t check_not_in_host_work(const char* what) const {
    if (sticky_error_.load(std::memory_order_relaxed)) {
      return fail(ARCPOOL_STATUS_CUDA_ERROR,
                  "host driver: %s failed: cudaErrorIllegalAddress (simulated sticky error)", what);
    }
    if (in_host_work()) {
      return fail(ARCPOOL_STATUS_NOT_PERMITTED,
                  "host driver: %s called from inside stream-ordered host work", what);
    }
    return ARCPOOL_STATUS_SUCCESS;
  }

  arcpool_status_t resolve(stream_handle s, const char* what, std::shared_ptr<host_stream>* out) {
    ARCPOOL_RETURN_IF_ERROR(check_not_in_host_work(what));
    *out = host_stream_find(s);
    if (!*out) {
      return fail(ARCPOOL_STATUS_INVALID_ARGUMENT, "host driver: %s: %p is not a live stream", what,
                  static_cast<void*>(s));
    }
    return ARCPOOL_STATUS_SUCCESS;
  }

  // As resolve, and refuses a capturing stream (the host driver builds no graphs).
  arcpool_status_t resolve_for_work(stream_handle s, const char* what,
                                    std::shared_ptr<host_stream>* out) {
    ARCPOOL_RETURN_IF_ERROR(resolve(s, what, out));
    if ((*out)->capturing.load()) {
      return fail(ARCPOOL_STATUS_UNSUPPORTED, "host driver: %s on capturing stream %p", what,
                  static_cast<void*>(s));
    }
    return ARCPOOL_STATUS_SUCCESS;
  }

  /// Address space with no backing memory (never touched; replays of large traces).
  static void* reserve(size_t bytes) {
    void* p = mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    return p == MAP_FAILED ? nullptr : p;
  }

  const int device_;
  const size_t capacity_;
  const bool reserve_only_;
  std::atomic<bool> sticky_error_{false};
  struct pool_counters {
    std::atomic<uint64_t> reserved{0};
    std::atomic<uint64_t> peak{0};
  };
  const std::shared_ptr<pool_counters> counters_ = std::make_shared<pool_counters>();
};

}  // namespace

void inject_sticky_error(driver& d) {
  if (auto* host = dynamic_cast<host_driver*>(&d)) host->inject_sticky_error();
}

std::unique_ptr<driver> make_host_driver(const driver_config& config, arcpool_status_t* status) {
  *status = ARCPOOL_STATUS_SUCCESS;
  return std::make_unique<host_driver>(config);
}

}  // namespace arcpool::detail
