#include "core/fence.hpp"

#include "support/status.hpp"

namespace arcpool::detail {

void fence::release() noexcept {
  if (refs_.decrement()) pool_->recycle(this);
}

event_pool::event_pool(driver& drv, size_t capacity)
    : driver_(drv), shard_capacity_(capacity <= 64 ? capacity : capacity / 8) {}

event_pool::~event_pool() {
  for (shard& s : shards_) {
    for (fence* f : s.free)
      destroy(f);
    for (fence* f = s.returned.load(std::memory_order_acquire); f != nullptr;) {
      fence* const next = f->next_returned_;
      destroy(f);
      f = next;
    }
  }
}

fence* event_pool::take_returned(shard& mine) {
  // A load first: most threads never have fences returned.
  if (mine.returned.load(std::memory_order_relaxed) == nullptr) return nullptr;
  fence* f = mine.returned.exchange(nullptr, std::memory_order_acquire);
  if (f == nullptr) return nullptr;
  for (fence* next = f->next_returned_; next != nullptr; next = next->next_returned_)
    mine.free.push_back(next);
  return f;
}

void event_pool::destroy(fence* f) noexcept {
  driver_.event_destroy(f->event_);
  delete f;
}

arcpool_status_t event_pool::record(stream_handle s, uint64_t stream_id, fence_ref* out,
                                    shard_slot slot) {
  fence* f = with_own_shard(slot, [](shard& mine) -> fence* {
    if (mine.free.empty()) return take_returned(mine);
    fence* last = mine.free.back();
    mine.free.pop_back();
    return last;
  });
  if (f == nullptr) {
    event_handle e = nullptr;
    ARCPOOL_RETURN_IF_ERROR(driver_.event_create(&e));
    f = new fence(this, e);
    created_.fetch_add(1, std::memory_order_relaxed);
  }
  if (arcpool_status_t status = driver_.event_record(f->event_, s);
      status != ARCPOOL_STATUS_SUCCESS) {
    // An event whose record failed (e.g. a capture began meanwhile) never returns to the pool.
    driver_.event_destroy(f->event_);
    delete f;
    return status;
  }
  f->stream_id_ = stream_id;
  f->home_ = slot.index;
  f->refs_.reset(1);
  *out = fence_ref::adopt(f);
  return ARCPOOL_STATUS_SUCCESS;
}

arcpool_status_t event_pool::record_outside_capture(stream_handle s, uint64_t stream_id,
                                                    fence_ref* out, bool* capturing) {
  ARCPOOL_RETURN_IF_ERROR(driver_.stream_is_capturing(s, capturing));
  if (*capturing) return ARCPOOL_STATUS_SUCCESS;
  ARCPOOL_RETURN_IF_ERROR(record(s, stream_id, out));
  ARCPOOL_RETURN_IF_ERROR(driver_.stream_is_capturing(s, capturing));
  if (*capturing) {
    fence* f = out->detach();  // the one reference: never recycled
    driver_.event_destroy(f->event_);
    delete f;
  }
  return ARCPOOL_STATUS_SUCCESS;
}

size_t event_pool::events_created() const {
  return created_.load(std::memory_order_relaxed);
}

void event_pool::recycle(fence* f) noexcept {
  const shard_slot slot = thread_shard();
  const bool kept = with_own_shard(slot, [&](shard& mine) {
    if (mine.free.size() >= shard_capacity_) return false;
    mine.free.push_back(f);
    return true;
  });
  if (kept) return;
  if (f->home_ == slot.index) {
    destroy(f);  // its own shard is full
    return;
  }
  std::atomic<fence*>& home = shards_[f->home_].returned;
  fence* head = home.load(std::memory_order_relaxed);
  do {
    f->next_returned_ = head;
  } while (
      !home.compare_exchange_weak(head, f, std::memory_order_release, std::memory_order_relaxed));
}

}  // namespace arcpool::detail
