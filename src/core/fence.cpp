#include "core/fence.hpp"

#include <new>

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
    destroy_chain(s.returned.load(std::memory_order_acquire));
  }
}

fence* event_pool::take_returned(shard& mine, fence** excess) {
  // A load first: most threads never have fences returned.
  if (mine.returned.load(std::memory_order_relaxed) == nullptr) return nullptr;
  fence* f = mine.returned.exchange(nullptr, std::memory_order_acquire);
  if (f == nullptr) return nullptr;
  size_t taken = 1;
  fence* next = f->next_returned_;
  // The caller reserved the storage, if it could: the pushes do not allocate.
  for (; next != nullptr && has_room(mine); next = next->next_returned_) {
    mine.free.push_back(next);
    ++taken;
  }
  *excess = next;  // past the shard's capacity: the caller destroys them, outside its lock
  for (; next != nullptr; next = next->next_returned_)
    ++taken;
  mine.returned_count.fetch_sub(taken, std::memory_order_relaxed);
  return f;
}

void event_pool::reserve_room(shard& mine) noexcept {
  if (mine.free.capacity() >= shard_capacity_) return;
  try {
    mine.free.reserve(shard_capacity_);
  } catch (const std::bad_alloc&) {
    // No host memory: the shard keeps the room it has (see the declaration).
  }
}

void event_pool::destroy(fence* f) noexcept {
  driver_.event_destroy(f->event_);
  delete f;
}

void event_pool::destroy_chain(fence* f) noexcept {
  while (f != nullptr) {
    fence* const next = f->next_returned_;
    destroy(f);
    f = next;
  }
}

arcpool_status_t event_pool::record(stream_handle s, uint64_t stream_id, fence_ref* out,
                                    shard_slot slot) {
  fence* excess = nullptr;
  fence* f = with_own_shard(slot, [&](shard& mine) -> fence* {
    if (mine.free.empty()) {
      reserve_room(mine);
      return take_returned(mine, &excess);
    }
    fence* last = mine.free.back();
    mine.free.pop_back();
    return last;
  });
  destroy_chain(excess);
  if (f == nullptr) {
    event_handle e = nullptr;
    ARCPOOL_RETURN_IF_ERROR(driver_.event_create(&e));
    f = new (std::nothrow) fence(this, e);
    if (f == nullptr) {
      driver_.event_destroy(e);  // the event goes with the fence it was made for
      return fail(ARCPOOL_STATUS_OUT_OF_MEMORY, "no host memory for a fence's record");
    }
    created_.fetch_add(1, std::memory_order_relaxed);
  }
  arcpool_status_t status = ARCPOOL_STATUS_SUCCESS;
  try {
    status = driver_.event_record(f->event_, s);
  } catch (...) {
    destroy(f);  // the host driver queues the record as work, which may find no host memory
    throw;
  }
  if (status != ARCPOOL_STATUS_SUCCESS) {
    // An event whose record failed (e.g. a capture began meanwhile) never returns to the pool.
    destroy(f);
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
    destroy(out->detach());  // the one reference: never recycled
  }
  return ARCPOOL_STATUS_SUCCESS;
}

size_t event_pool::events_created() const {
  return created_.load(std::memory_order_relaxed);
}

void event_pool::recycle(fence* f) noexcept {
  const shard_slot slot = thread_shard();
  const bool kept = with_own_shard(slot, [&](shard& mine) {
    if (!has_room(mine)) return false;
    mine.free.push_back(f);  // within the reserved storage: no allocation
    return true;
  });
  if (kept) return;
  if (f->home_ == slot.index) {
    destroy(f);  // its own shard is full
    return;
  }
  shard& home = shards_[f->home_];
  // The chain holds about a shard's capacity at most; past that, as before, the event goes.
  if (home.returned_count.fetch_add(1, std::memory_order_relaxed) >= shard_capacity_) {
    home.returned_count.fetch_sub(1, std::memory_order_relaxed);
    destroy(f);
    return;
  }
  fence* head = home.returned.load(std::memory_order_relaxed);
  do {
    f->next_returned_ = head;
  } while (!home.returned.compare_exchange_weak(head, f, std::memory_order_release,
                                                std::memory_order_relaxed));
}

}  // namespace arcpool::detail
