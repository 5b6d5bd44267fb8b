#include "core/stream.hpp"

#include "support/status.hpp"

namespace arcpool::detail {

uint64_t this_thread_serial() noexcept {
  static std::atomic<uint64_t> next{1};
  thread_local const uint64_t serial = next.fetch_add(1, std::memory_order_relaxed);
  return serial;
}

arcpool_status_t stream_entry::retire(event_pool& events) {
  std::unique_lock<shared_spinlock> lock(mutex_);
  if (!alive_.load(std::memory_order_relaxed)) return ARCPOOL_STATUS_SUCCESS;
  fence_ref last;
  ARCPOOL_RETURN_IF_ERROR(events.record(handle_, id_, &last));
  final_ = std::move(last);
  alive_.store(false, std::memory_order_release);
  return ARCPOOL_STATUS_SUCCESS;
}

}  // namespace arcpool::detail
