#include "core/graph_pool.hpp"

#include <algorithm>
#include <new>

#include "core/allocator.hpp"
#include "support/status.hpp"

namespace arcpool::detail {

graph_pool::graph_pool(allocator& owner) : owner_(owner) {
  owner_.record_created();
}

void graph_pool::release() noexcept {
  if (!refs_.decrement()) return;
  // Every block is free now: each lent one held a reference (a written-off one is no longer
  // the pool's: abandon). The reclaim worker gives them back to the allocator's pool once
  // their fences completed.
  for (block& b : free_) {
    owner_.stats_.sub(stat::graph_pool_bytes, static_cast<int64_t>(b.bytes));
    std::unique_ptr<reclaim_item> item;
    try {
      item = owner_.reclaimer_.prepare();
    } catch (const std::exception&) {
      // No host memory (or no thread) for its deferred free: the block stays in the
      // allocator's pool until the pool goes, counted (a release cannot fail).
      owner_.stats_.count(stat::reclaim_failures);
      continue;
    }
    item->pointer = b.base;
    item->bytes = b.bytes;
    item->fences = std::move(b.fences);
    item->counted_on = &owner_.stream_stats_.other();  // the pool's, not one stream's
    owner_.reclaimer_.enqueue(std::move(item));
  }
  allocator& owner = owner_;
  delete this;
  owner.record_destroyed();
}

arcpool_status_t graph_pool::take(size_t bytes, uint64_t capture, uint64_t stream, void** base,
                                  size_t* held_bytes, tag* where) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    size_t best = free_.size();
    for (size_t i = 0; i < free_.size(); ++i) {
      const block& b = free_[i];
      const bool allowed =
          b.where.capture == 0 || (b.where.capture == capture && b.where.stream == stream);
      // At most twice the request, so that a small allocation does not pin a large block.
      if (!allowed || b.bytes < bytes || b.bytes / 2 > bytes) continue;
      if (best != free_.size() && b.bytes >= free_[best].bytes) continue;
      if (work_done(free_[i])) best = i;
    }
    if (best != free_.size()) {
      *base = free_[best].base;
      *held_bytes = free_[best].bytes;
      *where = free_[best].where;
      free_[best] = std::move(free_.back());
      free_.pop_back();
      ++lent_;
      return ARCPOOL_STATUS_SUCCESS;
    }
    // Room in the free list for every lent block's return, this one's included, so that its
    // return (give) allocates nothing after its deallocation committed (design.md §10).
    try {
      free_.reserve(free_.size() + lent_ + 1);
    } catch (const std::bad_alloc&) {
      return fail(ARCPOOL_STATUS_OUT_OF_MEMORY, "no host memory for a graph pool's free list");
    }
    ++lent_;
  }
  if (arcpool_status_t status = grow(bytes, base); status != ARCPOOL_STATUS_SUCCESS) {
    std::lock_guard<std::mutex> lock(mutex_);
    --lent_;
    return status;
  }
  *held_bytes = bytes;
  *where = tag{};
  return ARCPOOL_STATUS_SUCCESS;
}

arcpool_status_t graph_pool::grow(size_t bytes, void** base) {
  // Grow outside the capture: an allocation on the reclaim worker's stream (never captured),
  // then a wait for it, so that the block is usable by whatever stream the graph runs on. The
  // synchronization runs in relaxed capture mode (it would be "potentially unsafe" otherwise).
  stream_handle s = nullptr;
  ARCPOOL_RETURN_IF_ERROR(owner_.reclaimer_.reclaim_stream(&s));
  stream_ref ref;
  ref.handle = s;
  ARCPOOL_RETURN_IF_ERROR(owner_.try_pool_allocate(bytes, ref, base));
  if (arcpool_status_t status = owner_.driver_->stream_synchronize(s);
      status != ARCPOOL_STATUS_SUCCESS) {
    owner_.driver_->pool_free(*base, bytes, s);
    owner_.stats_.sub(stat::bytes_held, static_cast<int64_t>(bytes));
    return status;
  }
  owner_.stats_.add(stat::graph_pool_bytes, static_cast<int64_t>(bytes));
  return ARCPOOL_STATUS_SUCCESS;
}

bool graph_pool::work_done(block& b) {
  while (!b.fences.empty()) {
    bool done = false;
    if (owner_.driver_->event_query(b.fences.back()->event(), &done) != ARCPOOL_STATUS_SUCCESS ||
        !done) {
      return false;
    }
    b.fences.pop_back();
  }
  return true;
}

void graph_pool::give(void* base, size_t held_bytes, tag where, fence_list fences) noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  --lent_;
  block b;
  b.base = base;
  b.bytes = held_bytes;
  b.where = where;
  b.fences = std::move(fences);
  free_.push_back(std::move(b));
}

void graph_pool::abandon() noexcept {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    --lent_;
  }
  release();
}

arcpool_status_t graph_pool::capture_bound(uint64_t capture) {
  std::lock_guard<std::mutex> lock(mutex_);
  try {
    captures_.push_back(capture);
  } catch (const std::bad_alloc&) {
    return fail(ARCPOOL_STATUS_OUT_OF_MEMORY, "no host memory for a graph pool's binding");
  }
  return ARCPOOL_STATUS_SUCCESS;
}

bool graph_pool::hears_of(uint64_t capture) {
  std::lock_guard<std::mutex> lock(mutex_);
  return std::find(captures_.begin(), captures_.end(), capture) != captures_.end();
}

void graph_pool::capture_unbound(uint64_t capture) noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = std::find(captures_.begin(), captures_.end(), capture);
  if (it != captures_.end()) captures_.erase(it);
}

void graph_pool::capture_ended(uint64_t capture) {
  std::lock_guard<std::mutex> lock(mutex_);
  captures_.erase(std::remove(captures_.begin(), captures_.end(), capture), captures_.end());
  for (block& b : free_)
    if (b.where.capture == capture) b.where = tag{};
}

}  // namespace arcpool::detail
