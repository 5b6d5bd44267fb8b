// The null driver: no work, fake addresses. It exists only so that benchmarks can measure
// arcpool's own bookkeeping on the CPU, where a few nanoseconds are visible (design.md §13).
// Streams are numbers, events are always complete, the pool bumps a counter and never reuses.
#include <atomic>

#include "drivers/driver.hpp"
#include "support/shards.hpp"
#include "support/status.hpp"

namespace arcpool::detail {
namespace {

constexpr uintptr_t kFirstAddress = uintptr_t{1} << 47;  // never dereferenced
/// The next thread region of every null driver in the process: a thread's region serves every
/// allocator it allocates from, so that fake addresses are unique in the process, as the
/// by-pointer map (the process's) needs.
std::atomic<uintptr_t> g_next_region{kFirstAddress};
std::atomic<uintptr_t> g_next_stream{0x1000};
thread_local uint64_t t_per_thread_id = 0;
std::atomic<uint64_t> g_next_per_thread_id{uint64_t{1} << 40};

class null_driver final : public driver {
 public:
  explicit null_driver(int device) : device_(device) {}

  arcpool_driver_kind_t kind() const noexcept override { return ARCPOOL_DRIVER_NULL; }
  int device() const noexcept override { return device_; }

  arcpool_status_t stream_create(stream_handle* out) override {
    *out = reinterpret_cast<stream_handle>(g_next_stream.fetch_add(16));
    return ARCPOOL_STATUS_SUCCESS;
  }
  arcpool_status_t stream_destroy(stream_handle) override { return ARCPOOL_STATUS_SUCCESS; }
  arcpool_status_t stream_synchronize(stream_handle) override { return ARCPOOL_STATUS_SUCCESS; }
  arcpool_status_t stream_id(stream_handle s, uint64_t* out) override {
    if (s == per_thread_default_stream()) {
      if (t_per_thread_id == 0) t_per_thread_id = g_next_per_thread_id.fetch_add(1);
      *out = t_per_thread_id;
    } else {
      *out = s == legacy_stream_alias() ? 0 : reinterpret_cast<uintptr_t>(s);
    }
    return ARCPOOL_STATUS_SUCCESS;
  }
  arcpool_status_t stream_is_capturing(stream_handle, bool* out) override {
    *out = false;
    return ARCPOOL_STATUS_SUCCESS;
  }
  arcpool_status_t stream_begin_capture(stream_handle) override {
    return fail(ARCPOOL_STATUS_UNSUPPORTED, "the null driver does not capture");
  }
  arcpool_status_t stream_end_capture(stream_handle) override {
    return fail(ARCPOOL_STATUS_UNSUPPORTED, "the null driver does not capture");
  }
  arcpool_status_t launch_host_func(stream_handle, arcpool_host_fn_t fn, void* user_data) override {
    fn(user_data);  // nothing is ever queued: it runs now
    return ARCPOOL_STATUS_SUCCESS;
  }

  arcpool_status_t event_create(event_handle* out) override {
    *out = reinterpret_cast<event_handle>(uintptr_t{0xE0E0});
    return ARCPOOL_STATUS_SUCCESS;
  }
  void event_destroy(event_handle) noexcept override {}
  arcpool_status_t event_record(event_handle, stream_handle) override {
    return ARCPOOL_STATUS_SUCCESS;
  }
  arcpool_status_t stream_wait_event(stream_handle, event_handle) override {
    return ARCPOOL_STATUS_SUCCESS;
  }
  arcpool_status_t event_query(event_handle, bool* done) override {
    *done = true;
    return ARCPOOL_STATUS_SUCCESS;
  }
  arcpool_status_t event_synchronize(event_handle) override { return ARCPOOL_STATUS_SUCCESS; }

  // Each thread bumps its own 1 TiB region (g_next_region): the fake pool never contends.
  arcpool_status_t pool_allocate(size_t bytes, stream_handle, void** out) override {
    thread_local uintptr_t next = 0;
    thread_local uintptr_t end = 0;
    if (bytes > kRegion) {  // also keeps the rounding below from wrapping to 0
      return fail(ARCPOOL_STATUS_OUT_OF_MEMORY, "null driver: %zu bytes is more than its %zu",
                  bytes, static_cast<size_t>(kRegion));
    }
    const size_t rounded = (bytes + 255) & ~size_t{255};
    if (end - next < rounded) {
      next = g_next_region.fetch_add(kRegion, std::memory_order_relaxed);
      end = next + kRegion;
    }
    *out = reinterpret_cast<void*>(next);
    next += rounded;
    used_.add(static_cast<int64_t>(rounded));
    return ARCPOOL_STATUS_SUCCESS;
  }
  arcpool_status_t pool_free(void*, size_t bytes, stream_handle) override {
    used_.add(-static_cast<int64_t>((bytes + 255) & ~size_t{255}));
    return ARCPOOL_STATUS_SUCCESS;
  }
  arcpool_status_t pool_trim(size_t) override { return ARCPOOL_STATUS_SUCCESS; }
  pool_figures pool_query() override {
    pool_figures f;
    f.used_current = f.reserved_current = static_cast<uint64_t>(used_.sum());
    return f;
  }
  arcpool_status_t device_memory(size_t* out) override {
    *out = size_t{1} << 40;
    return ARCPOOL_STATUS_SUCCESS;
  }
  arcpool_status_t device_synchronize() override { return ARCPOOL_STATUS_SUCCESS; }
  void enter_reclaim_thread() noexcept override {}

 private:
  static constexpr uintptr_t kRegion = uintptr_t{1} << 40;
  const int device_;
  sharded_counter used_;
};

}  // namespace

std::unique_ptr<driver> make_null_driver(const driver_config& config) {
  return std::make_unique<null_driver>(config.device);
}

}  // namespace arcpool::detail
