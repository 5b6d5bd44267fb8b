// Allocation (design.md §3, §7): the fast path's cache hit, the pool with its out-of-memory
// retry, and imports.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <new>

#include "core/allocator.hpp"
#include "observe/nvtx.hpp"
#include "support/status.hpp"

namespace arcpool::detail {
namespace {

constexpr size_t kPoolAlignment = ARCPOOL_DEFAULT_ALIGNMENT;

bool is_power_of_two(size_t x) {
  return x != 0 && (x & (x - 1)) == 0;
}

/// Allocation serial numbers, unique per process, taken from a global counter in blocks so
/// that threads do not contend on it.
uint64_t next_serial(thread_state& ts = this_thread_state()) noexcept {
  constexpr uint64_t kBlock = 1024;
  static std::atomic<uint64_t> global{1};
  if (ts.next_serial == ts.serial_end) {
    ts.next_serial = global.fetch_add(kBlock, std::memory_order_relaxed);
    ts.serial_end = ts.next_serial + kBlock;
  }
  return ts.next_serial++;
}

}  // namespace

arcpool_status_t allocator::padded_size(size_t size, size_t alignment, size_t* out) {
  // Alignments above the pool's are served by over-allocating and aligning up.
  const size_t extra = alignment > kPoolAlignment ? alignment - kPoolAlignment : 0;
  if (size > SIZE_MAX - extra) {
    return fail(ARCPOOL_STATUS_OUT_OF_MEMORY, "%zu bytes with alignment %zu overflow size_t", size,
                alignment);
  }
  // Held bytes count in an int64_t (and a hard limit compares with them): a request past it,
  // more than any device holds, would count as negative bytes.
  if (size + extra > static_cast<size_t>(INT64_MAX)) {
    return fail(ARCPOOL_STATUS_OUT_OF_MEMORY,
                "%zu bytes (alignment %zu) is more than any device holds", size, alignment);
  }
  *out = size + extra;
  return ARCPOOL_STATUS_SUCCESS;
}

void* allocator::align_up(void* p, size_t alignment) {
  const auto v = reinterpret_cast<uintptr_t>(p);
  return reinterpret_cast<void*>((v + alignment - 1) & ~(uintptr_t{alignment} - 1));
}

// ---------------------------------------------------------------------------------------------
// Allocation

arcpool_status_t allocator::try_pool_allocate(size_t bytes, const stream_ref& s, void** out) {
  const auto n = static_cast<int64_t>(bytes);
  const size_t limit = hard_limit_.load(std::memory_order_relaxed);
  if (limit == 0) {
    // Counted once held: a request the pool refuses raises no peak.
    ARCPOOL_RETURN_IF_ERROR(driver_->pool_allocate(bytes, s.handle, out));
    stats_.add(stat::bytes_held, n);
    return ARCPOOL_STATUS_SUCCESS;
  }
  // Held bytes count in an int64_t: a limit past it (SIZE_MAX, a caller's "no limit") limits
  // nothing more than INT64_MAX does. The bytes are reserved under the limit before the pool's
  // call, and the peak raised only once the pool lent them.
  const auto counted_limit = static_cast<int64_t>(std::min<size_t>(limit, INT64_MAX));
  int64_t held = 0;
  if (!stats_.try_reserve(stat::bytes_held, n, counted_limit, &held)) {
    return fail(ARCPOOL_STATUS_OUT_OF_MEMORY, "hard limit of %zu bytes reached", limit);
  }
  const arcpool_status_t status = driver_->pool_allocate(bytes, s.handle, out);
  if (status != ARCPOOL_STATUS_SUCCESS) {
    stats_.sub(stat::bytes_held, n);
    return status;
  }
  stats_.raise_peak(stat::bytes_held, held);
  return ARCPOOL_STATUS_SUCCESS;
}

arcpool_status_t allocator::allocate_from_pool(size_t bytes, size_t requested, const stream_ref& s,
                                               void** out) {
  arcpool_status_t status = try_pool_allocate(bytes, s, out);
  if (status != ARCPOOL_STATUS_OUT_OF_MEMORY) return status;
  // Out of memory: complete pending reclaims, retry once, then ask the user's callback.
  stats_.count(stat::oom_retries);
  // The legacy default stream is touched only when the caller passed it (§6). The flushed
  // frees must have run before the retry: the pool lends a block freed on another stream only
  // once its free completed.
  flush_caches(/*include_legacy=*/s.kind == stream_kind::legacy_default, /*synchronize=*/true);
  reclaimer_.drain();
  // Frees already queued on arcpool's other streams (same-stream and routed frees, caches off)
  // hold pool memory until they run: an owned pool inserts no hidden wait to lend it. Streams
  // arcpool does not know may be gone: their frees are not waited for.
  synchronize_known_streams();
  status = try_pool_allocate(bytes, s, out);
  while (status == ARCPOOL_STATUS_OUT_OF_MEMORY && config_.on_out_of_memory != nullptr &&
         config_.on_out_of_memory(requested, config_.on_out_of_memory_user_data) != 0) {
    status = try_pool_allocate(bytes, s, out);
  }
  if (status != ARCPOOL_STATUS_OUT_OF_MEMORY) return status;
  stats_.count(stat::oom_failures);
  char cause[kLastErrorBytes];  // the pool's own message, kept while fail() writes over it
  std::snprintf(cause, sizeof(cause), "%s", last_error());
  const pool_figures pool = driver_->pool_query();
  return fail(ARCPOOL_STATUS_OUT_OF_MEMORY,
              "cannot allocate %zu bytes on device %d (stream %p): %s; allocator: %llu bytes in "
              "use, %llu held, %llu pending free; pool: %llu reserved, %llu used; hard limit %zu",
              requested, driver_->device(), static_cast<void*>(s.handle), cause,
              static_cast<unsigned long long>(stats_.current(stat::bytes_in_use)),
              static_cast<unsigned long long>(stats_.current(stat::bytes_held)),
              static_cast<unsigned long long>(stats_.current(stat::bytes_pending_free)),
              static_cast<unsigned long long>(pool.reserved_current),
              static_cast<unsigned long long>(pool.used_current),
              hard_limit_.load(std::memory_order_relaxed));
}

arcpool_status_t allocator::take_from_pool(allocation::params& p, stream_handle s) {
  if (p.size == 0) return ARCPOOL_STATUS_SUCCESS;
  if (arcpool_status_t status = padded_size(p.size, p.alignment, &p.held_bytes);
      status != ARCPOOL_STATUS_SUCCESS) {
    stats_.count(stat::oom_failures);
    return status;
  }
  if (arcpool_status_t status = allocate_from_pool(p.held_bytes, p.size, p.origin, &p.base);
      status != ARCPOOL_STATUS_SUCCESS) {
    if (log_.enabled()) log_.write("allocate failure", nullptr, p.size, s);
    return status;
  }
  if (history_.enabled()) history_.segment_alloc(p.base, p.held_bytes, s);
  p.data = align_up(p.base, p.alignment);
  return ARCPOOL_STATUS_SUCCESS;
}

template <class Local>
inline void allocator::count_allocation(const stream_ref& origin, void* base, void* data,
                                        size_t size, uint64_t serial, Local& st, bool cache_hit,
                                        bool row_counted) {
  st.count(cache_hit ? stat::cache_hits : stat::allocations);  // a hit is an allocation (sum)
  st.add(stat::allocations_in_use, 1);  // first: a flush of the bytes takes the count along
  st.add(stat::bytes_in_use, static_cast<int64_t>(size));
  if (!row_counted) stream_stats_of(origin).allocated(size, cache_hit);
  if (log_.enabled()) log_.write("allocate", data, size, origin.handle);
  if (history_.enabled()) history_.alloc(base, data, size, origin.handle);
  nvtx::name_region(data, size, serial);
}

template <bool Plain>
allocation* allocator::allocate_cached(thread_state& ts, block_cache& cache, size_t size,
                                       size_t alignment, const stream_ref& origin) {
  // The record's storage before the block, so that a hit, once counted, cannot fail.
  void* storage = ts.records.allocate();
  if (storage == nullptr) return nullptr;
  // The stream's own row counts the hit under the cache's lock, with no locked instruction.
  stream_stats& row = stream_stats_of(origin);
  bool row_counted = false;
  void* block = cache.take(size, [&](const spinlock& held) {
    row_counted = row.allocated_if_guarded_by(held, size, /*cache_hit=*/true);
  });
  if (block == nullptr) {
    ts.records.free(storage);
    return nullptr;
  }
  // Only created, registered and legacy default streams have caches: never a per-thread
  // default stream, whose allocations take a fence (allocate_uncached).
  if (notes_cache_moves_) driver_->note_acquire(block, size, origin.handle);
  allocation* a =
      ::new (storage) allocation(*this, origin, size, alignment, block, next_serial(ts));
  if (Plain) {
    // The fast path's thread owns its shard (fast_path_open), and nothing observes it but the
    // statistics.
    const shard_slot slot{ts.slot.index, true};
    records_.add(slot, 1);
    if (!row_counted) row.allocated(size, /*cache_hit=*/true);
    stats_.owned_cache_hit(slot.index, static_cast<int64_t>(size));
    return a;
  }
  const shard_slot slot = thread_shard(ts);
  records_.add(slot, 1);
  auto count_hit = [&](auto st) {
    st.sub(stat::bytes_cached, static_cast<int64_t>(size));
    count_allocation(origin, block, block, size, a->placement.serial, st, /*cache_hit=*/true,
                     row_counted);
  };
  if (slot.exclusive) {
    count_hit(stats_.owned_at(slot));  // the common case: no ownership test per update
  } else {
    count_hit(stats_.at(slot));
  }
  return a;
}

arcpool_status_t allocator::allocate(size_t size, size_t alignment, stream_handle s, uint32_t flags,
                                     allocation** out) {
  // The fast path: a cache hit, a block of exactly this size freed earlier on this stream.
  // Stream order makes it safe with no event: every wait it needed was enqueued before it was
  // cached. It serves a created or registered stream, or the legacy default stream, that this
  // thread looked up before (one line of its stream cache), with no flags, the pool's alignment or
  // less, and nothing observing (fast_path_open). It takes no lock but the stream cache's spinlock,
  // allocates nothing from the heap (the record comes from the thread's free list) and makes one
  // runtime call, the capture check. Budget, with the same-stream free and the release:
  // tools/instruction-budget's "pair" row.
  thread_state& ts = this_thread_state();
  const stream_cache_line& line = ts.stream_line(s);
  if ((flags | (alignment & (alignment - 1))) == 0 && alignment <= kPoolAlignment &&
      line.handle == s && line.stamp == streams_.stamp() && fast_path_open(ts)) {
    const stream_ref origin{s, line.id, line.kind, line.entry, 0};
    if (block_cache* cache = cache_for(origin)) {
      bool capturing = false;
      ARCPOOL_RETURN_IF_ERROR(driver_->stream_is_capturing(s, &capturing));
      if (alignment == 0) alignment = ARCPOOL_DEFAULT_ALIGNMENT;
      if (capturing) return allocate_in_capture(size, alignment, 0, origin, out);
      if (allocation* a = allocate_cached<true>(ts, *cache, size, alignment, origin)) {
        *out = a;
        return ARCPOOL_STATUS_SUCCESS;
      }
      return allocate_uncached(size, alignment, flags, origin, out);
    }
  }
  return allocate_general(size, alignment, s, flags, out);
}

arcpool_status_t allocator::allocate_general(size_t size, size_t alignment, stream_handle s,
                                             uint32_t flags, allocation** out) {
  if (alignment == 0) alignment = ARCPOOL_DEFAULT_ALIGNMENT;
  if (!is_power_of_two(alignment) || alignment > ARCPOOL_MAX_ALIGNMENT) {
    return fail(ARCPOOL_STATUS_INVALID_ARGUMENT, "alignment %zu is not a power of two up to %zu",
                alignment, ARCPOOL_MAX_ALIGNMENT);
  }
  if ((flags & ~uint32_t{ARCPOOL_ALLOCATION_FLAG_INDETERMINATE_LIFETIME}) != 0) {
    return fail(ARCPOOL_STATUS_INVALID_ARGUMENT, "unknown allocation flags 0x%x", flags);
  }
  stream_ref origin;
  ARCPOOL_RETURN_IF_ERROR(resolve_stream(s, &origin));
  bool capturing = false;
  ARCPOOL_RETURN_IF_ERROR(driver_->stream_is_capturing(s, &capturing));
  if (capturing) return allocate_in_capture(size, alignment, flags, origin, out);
  // A cache holds only blocks of cacheable sizes (free_block), so the hit checks no size.
  if (flags == 0 && alignment <= ARCPOOL_DEFAULT_ALIGNMENT) {
    if (block_cache* cache = cache_for(origin)) {
      if (allocation* a =
              allocate_cached<false>(this_thread_state(), *cache, size, alignment, origin)) {
        *out = a;
        return ARCPOOL_STATUS_SUCCESS;
      }
    }
  }
  return allocate_uncached(size, alignment, flags, origin, out);
}

arcpool_status_t allocator::allocate_uncached(size_t size, size_t alignment, uint32_t flags,
                                              const stream_ref& origin, allocation** out) {
  const stream_handle s = origin.handle;
  allocation::params p;
  p.origin = origin;
  p.placement_flags = ARCPOOL_PLACEMENT_FLAG_ASYNCHRONOUS;
  if (flags & ARCPOOL_ALLOCATION_FLAG_INDETERMINATE_LIFETIME) {
    p.placement_flags |= ARCPOOL_PLACEMENT_FLAG_INDETERMINATE_LIFETIME;
  }
  p.size = size;
  p.alignment = alignment;
  p.cacheable =
      cacheable(size, alignment) && !(flags & ARCPOOL_ALLOCATION_FLAG_INDETERMINATE_LIFETIME);
  ARCPOOL_RETURN_IF_ERROR(take_from_pool(p, s));
  // Another thread may deallocate or transfer it, and cannot fence this thread's per-thread
  // default stream: fence it now, after the allocation (§6).
  fence_ref named;
  if (p.origin.kind == stream_kind::per_thread_default && p.base != nullptr) {
    if (arcpool_status_t status = take_fence(p.origin, &named); status != ARCPOOL_STATUS_SUCCESS) {
      give_back(p, s);
      return status;
    }
  }
  p.serial = next_serial();
  allocation* a = new (std::nothrow) allocation(*this, p);
  if (a == nullptr) {
    give_back(p, s);
    return fail(ARCPOOL_STATUS_OUT_OF_MEMORY, "no host memory for an allocation record");
  }
  a->current_fence = std::move(named);
  record_created();
  stats::local st = stats_.here();
  count_allocation(p.origin, p.base, p.data, size, p.serial, st, /*cache_hit=*/false,
                   /*row_counted=*/false);
  *out = a;
  return ARCPOOL_STATUS_SUCCESS;
}

void allocator::give_back(const allocation::params& p, stream_handle s) {
  if (p.base == nullptr) return;
  history_.segment_free(p.base, s);
  driver_->pool_free(p.base, p.held_bytes, s);
  stats_.sub(stat::bytes_held, static_cast<int64_t>(p.held_bytes));
}

arcpool_status_t allocator::import(void* pointer, size_t size, stream_handle s, uint32_t flags,
                                   arcpool_on_free_t on_free, void* user_data, allocation** out) {
  const bool consume = flags & ARCPOOL_IMPORT_FLAG_CONSUME;
  // A consuming import owns the foreign claim from the start: every failure frees it.
  auto failed = [&](arcpool_status_t status) {
    if (consume && on_free != nullptr) on_free(pointer, size, user_data);
    return status;
  };
  constexpr uint32_t kImportFlags =
      ARCPOOL_IMPORT_FLAG_CONSUME | ARCPOOL_IMPORT_FLAG_INDETERMINATE_LIFETIME;
  if ((flags & ~kImportFlags) != 0) {
    return failed(fail(ARCPOOL_STATUS_INVALID_ARGUMENT, "unknown import flags 0x%x", flags));
  }
  if (consume && on_free == nullptr) {
    return fail(ARCPOOL_STATUS_INVALID_ARGUMENT, "a consuming import needs on_free");
  }
  if (pointer == nullptr && size != 0) {
    return failed(
        fail(ARCPOOL_STATUS_INVALID_ARGUMENT, "import of %zu bytes at a null pointer", size));
  }
  allocation::params p;
  if (arcpool_status_t status = resolve_stream(s, &p.origin); status != ARCPOOL_STATUS_SUCCESS) {
    return failed(status);
  }
  p.placement_flags = ARCPOOL_PLACEMENT_FLAG_ASYNCHRONOUS | ARCPOOL_PLACEMENT_FLAG_EXTERNAL;
  if (flags & ARCPOOL_IMPORT_FLAG_INDETERMINATE_LIFETIME) {
    p.placement_flags |= ARCPOOL_PLACEMENT_FLAG_INDETERMINATE_LIFETIME;
  }
  p.size = size;
  p.alignment = 1;
  p.base = pointer;
  p.data = pointer;
  p.on_free = on_free;
  p.on_free_user_data = user_data;
  // As at an allocation (allocate_uncached): another thread cannot fence this thread's
  // per-thread default stream, whose work so far (the memory's producer) its frees and
  // transfers must follow: fence it now (§6).
  fence_ref named;
  if (p.origin.kind == stream_kind::per_thread_default) {
    if (arcpool_status_t status = take_fence(p.origin, &named); status != ARCPOOL_STATUS_SUCCESS) {
      return failed(status);
    }
  }
  p.serial = next_serial();
  allocation* a = new (std::nothrow) allocation(*this, p);
  if (a == nullptr) {
    return failed(fail(ARCPOOL_STATUS_OUT_OF_MEMORY, "no host memory for an allocation record"));
  }
  a->current_fence = std::move(named);
  record_created();
  stats_.count(stat::imports);
  *out = a;
  return ARCPOOL_STATUS_SUCCESS;
}
}  // namespace arcpool::detail
