#include "core/stream.hpp"

#include "support/status.hpp"

namespace arcpool::detail {

uint64_t this_thread_serial() noexcept {
  static std::atomic<uint64_t> next{1};
  thread_local const uint64_t serial = next.fetch_add(1, std::memory_order_relaxed);
  return serial;
}

arcpool_status_t stream_entry::retire(event_pool& events) {
  std::lock_guard<std::mutex> lock(retire_mutex_);
  if (!alive_.load(std::memory_order_relaxed)) return ARCPOOL_STATUS_SUCCESS;
  // New with_alive calls wait from here; the ones in flight finish their enqueues first, so
  // the final fence covers them.
  closing_.store(true, std::memory_order_seq_cst);
  while (users_.load(std::memory_order_seq_cst) != 0)
    std::this_thread::yield();
  fence_ref last;
  if (arcpool_status_t status = events.record(handle_, id_, &last);
      status != ARCPOOL_STATUS_SUCCESS) {
    closing_.store(false, std::memory_order_release);  // still alive: the waiters go on
    return status;
  }
  final_ = std::move(last);
  alive_.store(false, std::memory_order_release);  // publishes final_
  return ARCPOOL_STATUS_SUCCESS;
}

}  // namespace arcpool::detail
