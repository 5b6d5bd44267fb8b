#include "fence.hpp"

#include "status.hpp"

namespace arcpool::detail {

void fence::release() noexcept {
  if (refs_.decrement()) pool_->recycle(this);
}

event_pool::event_pool(driver& drv, size_t capacity) : driver_(drv), capacity_(capacity) {}

event_pool::~event_pool() {
  for (fence* f : free_) {
    driver_.event_destroy(f->event_);
    delete f;
  }
}

arcpool_status_t event_pool::record(stream_handle s, uint64_t stream_id, fence_ref* out) {
  fence* f = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!free_.empty()) {
      f = free_.back();
      free_.pop_back();
    }
  }
  if (f == nullptr) {
    event_handle e = nullptr;
    ARCPOOL_RETURN_IF_ERROR(driver_.event_create(&e));
    f = new fence(this, e);
    std::lock_guard<std::mutex> lock(mutex_);
    ++created_;
  }
  if (arcpool_status_t status = driver_.event_record(f->event_, s);
      status != ARCPOOL_STATUS_SUCCESS) {
    // An event whose record failed (e.g. a capture began meanwhile) never returns to the pool.
    driver_.event_destroy(f->event_);
    delete f;
    return status;
  }
  f->stream_id_ = stream_id;
  f->refs_.reset(1);
  *out = fence_ref::adopt(f);
  return ARCPOOL_STATUS_SUCCESS;
}

size_t event_pool::events_created() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return created_;
}

void event_pool::recycle(fence* f) noexcept {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (free_.size() < capacity_) {
      free_.push_back(f);
      return;
    }
  }
  driver_.event_destroy(f->event_);
  delete f;
}

}  // namespace arcpool::detail
