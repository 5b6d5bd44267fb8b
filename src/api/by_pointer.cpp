// By-pointer allocation (frameworks, memory resources) and the ambient-stream policy of callers
// that pass no stream.
#include "api/entry.hpp"
#include "core/allocator.hpp"
#include "core/pointer_map.hpp"
#include "support/status.hpp"

namespace arcpool::detail {
namespace {

/// UNKNOWN_POINTER for a free of `p`.
arcpool_status_t unknown_pointer(const void* p) {
  return fail(ARCPOOL_STATUS_UNKNOWN_POINTER,
              "free of %p: no live by-pointer allocation contains it (never allocated by pointer, "
              "or already freed)",
              p);
}

}  // namespace

arcpool_status_t allocator::malloc_by_pointer(size_t size, size_t alignment, stream_handle s,
                                              void** out) {
  allocation* record = nullptr;
  ARCPOOL_RETURN_IF_ERROR(allocate(size, alignment, s, 0, &record));
  if (size == 0) {  // nothing to free later: no record kept
    const arcpool_status_t status = deallocate(*record, s, 0);
    record->release();
    *out = nullptr;
    return status;
  }
  // The map keeps the claim and the reference.
  if (!by_pointer_allocations().insert(record)) {
    // Nothing was handed out: the memory goes back in stream order, as a free would.
    const arcpool_status_t status = deallocate(*record, s, 0);
    record->release();
    *out = nullptr;
    return status != ARCPOOL_STATUS_SUCCESS
               ? status
               : fail(ARCPOOL_STATUS_OUT_OF_MEMORY,
                      "no host memory to record a by-pointer allocation of %zu bytes", size);
  }
  *out = record->placement.data;
  return ARCPOOL_STATUS_SUCCESS;
}

arcpool_status_t allocator::free_by_pointer(void* p, stream_handle s, int device) {
  if (p == nullptr) return ARCPOOL_STATUS_SUCCESS;
  pointer_map& map = by_pointer_allocations();
  // Out of the map before the free: once freed, the block may come back at once, at the same
  // address, to another thread's by-pointer allocation, whose entry must not meet this one.
  allocation* a = map.take(p);
  if (a == nullptr) return unknown_pointer(p);
  // Guarded here, not only at the entry point: a throw (no host memory, before the commit)
  // must come back through the re-insert below.
  const arcpool_status_t status = api::guarded([&] {
    if (device >= 0 && a->owner.drv().device() != device) {
      return fail(ARCPOOL_STATUS_INVALID_ARGUMENT, "free of %p on device %d: %s is on device %d", p,
                  device, a->describe().c_str(), a->owner.drv().device());
    }
    return a->owner.deallocate(*a, s, 0);
  });
  if (status != ARCPOOL_STATUS_SUCCESS) {
    // A pool free that failed after the commit (a broken context): the deallocation stands,
    // and the block is lost with the context. The entry stays out of the map.
    if (a->owners.load().st == ARCPOOL_ALLOCATION_DEALLOCATED) {
      a->release();
      return status;
    }
    // Nothing was freed: the entry goes back as it was, also when other threads' inserts filled
    // its table meanwhile and it cannot grow (over the table's half-full limit). Only a table
    // with no free slot but one refuses it: then the map's reference goes, and its last
    // reference frees the memory on its current stream (design.md §3).
    if (!map.put_back(a)) a->release();
    return status;
  }
  a->release();  // the map's reference
  return ARCPOOL_STATUS_SUCCESS;
}

void allocator::set_hard_limit(size_t bytes) {
  // From now on the held-bytes gauge is exact (changes already pending in other threads'
  // shards, at most 1 MiB each, are counted when they flush).
  if (bytes != 0) stats_.make_bytes_held_exact();
  hard_limit_.store(bytes, std::memory_order_relaxed);
}

arcpool_status_t allocator::set_ambient(arcpool_ambient_policy_t policy, stream_handle s) {
  // A bound stream operations could not name (INVALID_ARGUMENT: destroyed, another device's or
  // context's) is refused now, the policy unchanged: every ambient allocation would fail far
  // from the cause. A refusal that lasts only while a capture runs (UNSUPPORTED) is not.
  if (policy == ARCPOOL_AMBIENT_BOUND_STREAM) {
    if (const arcpool_status_t status = check_stream(s);
        status == ARCPOOL_STATUS_INVALID_ARGUMENT) {
      return status;
    }
  }
  std::lock_guard<std::mutex> lock(ambient_mutex_);
  ambient_policy_ = policy;
  ambient_bound_ = s;
  return ARCPOOL_STATUS_SUCCESS;
}

arcpool_status_t allocator::ambient_stream(stream_handle* out, bool* synchronize) {
  std::lock_guard<std::mutex> lock(ambient_mutex_);
  *synchronize = ambient_policy_ == ARCPOOL_AMBIENT_SYNCHRONIZE;
  switch (ambient_policy_) {
    case ARCPOOL_AMBIENT_BOUND_STREAM:
      *out = ambient_bound_;
      return ARCPOOL_STATUS_SUCCESS;
    case ARCPOOL_AMBIENT_SYNCHRONIZE:
      if (ambient_own_ == nullptr) ARCPOOL_RETURN_IF_ERROR(create_stream(&ambient_own_));
      *out = ambient_own_;
      return ARCPOOL_STATUS_SUCCESS;
    default:
      *out = legacy_default_stream();
      return ARCPOOL_STATUS_SUCCESS;
  }
}

arcpool_status_t allocator::ambient_malloc(size_t size, void** out) {
  stream_handle s = nullptr;
  bool synchronize = false;
  ARCPOOL_RETURN_IF_ERROR(ambient_stream(&s, &synchronize));
  ARCPOOL_RETURN_IF_ERROR(malloc_by_pointer(size, 0, s, out));
  if (!synchronize) return ARCPOOL_STATUS_SUCCESS;
  // Usable on any stream once the allocation itself has run.
  const arcpool_status_t status = driver_->stream_synchronize(s);
  if (status != ARCPOOL_STATUS_SUCCESS) {
    // A caller takes a failure for "nothing allocated": the memory goes back, in stream order
    // after its allocation. The synchronization's message stays unless the free fails too.
    if (free_by_pointer(*out, s, -1) != ARCPOOL_STATUS_SUCCESS) {
      append_to_last_error(" (freeing the allocation after its stream's synchronization failed)");
    }
    *out = nullptr;
    return status;
  }
  return ARCPOOL_STATUS_SUCCESS;
}

arcpool_status_t allocator::ambient_free(void* p) {
  if (p == nullptr) return ARCPOOL_STATUS_SUCCESS;  // as cudaFree: "no operation is performed"
  stream_handle s = nullptr;
  bool synchronize = false;
  ARCPOOL_RETURN_IF_ERROR(ambient_stream(&s, &synchronize));
  if (synchronize) {
    // A pointer with nothing to free is refused first: the synchronization would block, and
    // invalidate a capture, for nothing.
    allocation* a = by_pointer_allocations().find(p);
    if (a == nullptr) return unknown_pointer(p);
    a->release();
    // As cudaFree: whatever stream still uses the memory has finished first.
    ARCPOOL_RETURN_IF_ERROR(driver_->device_synchronize());
  }
  return free_by_pointer(p, s, -1);
}

}  // namespace arcpool::detail
