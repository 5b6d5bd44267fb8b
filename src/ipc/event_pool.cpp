#include "ipc/event_pool.hpp"

#include <new>

namespace arcpool::detail::ipc {

ipc_event_pool::~ipc_event_pool() {
  for (const entry& e : free_)
    drv_.event_destroy(e.event);
}

arcpool_status_t ipc_event_pool::take(entry* out) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!free_.empty()) {
      *out = free_.back();
      free_.pop_back();
      return ARCPOOL_STATUS_SUCCESS;
    }
  }
  return drv_.ipc_event_create(&out->event, &out->data);
}

void ipc_event_pool::give_back(const entry& e) noexcept {
  {
    std::lock_guard<std::mutex> lock(mu_);
    try {
      free_.push_back(e);
      return;
    } catch (const std::bad_alloc&) {
      // No host memory to keep it: no other process uses it again, so it may go now.
    }
  }
  drv_.event_destroy(e.event);
}

}  // namespace arcpool::detail::ipc
