// The control record of one allocation, and the C handle type (an allocation or a view).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "arcpool/arcpool.h"
#include "core/fence.hpp"
#include "core/ownership.hpp"
#include "core/stream.hpp"
#include "support/refcount.hpp"
#include "support/spinlock.hpp"
#include "support/thread_state.hpp"

namespace arcpool::detail {
class allocation;
class allocator;
class graph_pool;
struct reclaim_item;
}  // namespace arcpool::detail

/// The C handle. The primary handle of an allocation is its control record itself; a view is a
/// small separate object holding one reference to the record and no claim.
struct arcpool_allocation {
  arcpool::detail::allocation* const record;  ///< the allocation every ownership call acts on
  const size_t offset;                        ///< start of this handle's bytes within the data
  const size_t size;                          ///< bytes of this handle's range
  const bool is_view;
  arcpool::detail::refcount view_refs{1};  ///< a view's own references (unused otherwise)

  arcpool_allocation(arcpool::detail::allocation* r, size_t off, size_t n, bool view) noexcept
      : record(r), offset(off), size(n), is_view(view) {}
};

namespace arcpool::detail {

/// "Stream S also uses this allocation". With `at_deallocation` (S provably alive, or the
/// caller guarantees it outlives the deallocation) the fence is taken at deallocation or
/// transfer; `fence`, taken at record time, is used otherwise, and for a per-thread default S
/// when another thread deallocates (null for other streams fenced at deallocation).
struct use_record {
  stream_ref stream;
  fence_ref fence;
  bool at_deallocation = false;
};

/// Immutable facts and mutable ownership of one block of memory (design.md §3).
class allocation final : public arcpool_allocation {
 public:
  /// What the allocator knows at creation.
  struct params {
    uint64_t serial = 0;
    stream_ref origin;
    uint32_t placement_flags = 0;
    /// Its block may go into a stream's cache when freed (allocator::cacheable, decided once):
    /// never for imports, graph memory and an indeterminate lifetime, so that it also tells the
    /// deallocation's fast path that none of those is at hand.
    bool cacheable = false;
    size_t size = 0;
    size_t alignment = 0;
    void* base = nullptr;   ///< the pool's pointer (or the imported pointer)
    void* data = nullptr;   ///< base aligned up to `alignment`
    size_t held_bytes = 0;  ///< bytes taken from the pool for it (0 for imports)
    arcpool_on_free_t on_free = nullptr;
    void* on_free_user_data = nullptr;
    /// Graph memory: the capture sequence that allocated it (`capture_id`). A graph pool's
    /// block: the pool that lent it (`lender`, holding one of its references). One or the
    /// other by the placement flags, so that the record stays within its 320-byte block.
    union {
      uint64_t capture_id;
      graph_pool* lender;
    } made_by = {0};
  };

  allocation(allocator& owner, const params& p);
  ~allocation();
  allocation(const allocation&) = delete;
  allocation& operator=(const allocation&) = delete;
  /// A cache hit's record, built in place (`::new (storage)`, in a block of the calling
  /// thread's record list): `bytes` at `block` (held whole, aligned to the pool's alignment) on
  /// `origin`, ASYNCHRONOUS and nothing else.
  allocation(allocator& owner_allocator, const stream_ref& origin, size_t bytes, size_t alignment,
             void* block, uint64_t serial) noexcept
      : arcpool_allocation(this, 0, bytes, false),
        owner(owner_allocator),
        placement{serial,
                  origin,
                  ARCPOOL_PLACEMENT_FLAG_ASYNCHRONOUS,
                  /*cacheable=*/true,
                  bytes,
                  alignment,
                  block,
                  block,
                  bytes},
        current(origin) {}

  /// Records come from the calling thread's free list of record-sized blocks, not the heap.
  static void* operator new(size_t) {
    void* p = this_thread_state().records.allocate();
    if (p == nullptr) throw std::bad_alloc();
    return p;
  }
  static void* operator new(size_t, const std::nothrow_t&) noexcept {
    return this_thread_state().records.allocate();
  }
  static void operator delete(void* p) noexcept { this_thread_state().records.free(p); }
  static void operator delete(void* p, const std::nothrow_t&) noexcept {
    this_thread_state().records.free(p);
  }
  allocator& owner;  ///< holds one reference to the allocator while the record exists
  const params placement;

  refcount refs{1};  ///< R: handles that keep this record readable
  ownership owners;  ///< P and the ownership state

  /// Guards the fields below. A spinlock: two threads rarely act on one allocation at once,
  /// and an uncontended pthread mutex costs the fast path ~110 instructions per lock pair.
  spinlock mutex;
  stream_ref current;            ///< the stream the memory may be used on now
  std::vector<use_record> uses;  ///< other streams using it
  /// Indeterminate lifetime, once deallocated: its free, with the deallocation's fences, queued
  /// by the last reference (made by the deallocation, which can still fail; owned).
  reclaim_item* deferred_free = nullptr;
  /// Set while `current` is a per-thread default stream: a fence taken on it when it was named
  /// (allocate, transfer), on its own thread. Another thread cannot fence that stream, so this is
  /// what its deallocations and transfers wait on (design.md §6).
  fence_ref current_fence;

  /// DEALLOCATED or EXPORTED: the owners are gone and the memory was handed on.
  bool ended() const noexcept {
    const auto st = owners.load().st;
    return st == ARCPOOL_ALLOCATION_DEALLOCATED || st == ARCPOOL_ALLOCATION_EXPORTED;
  }
  /// A determinate lifetime (so no deferred free), and nothing else the record's destructor
  /// would release: no use-record storage, no fence. (What the fast path's allocations leave.)
  bool holds_nothing() const noexcept {
    return !indeterminate() && uses.capacity() == 0 && !current_fence;
  }
  bool indeterminate() const noexcept {
    return placement.placement_flags & ARCPOOL_PLACEMENT_FLAG_INDETERMINATE_LIFETIME;
  }
  bool external() const noexcept {
    return placement.placement_flags & ARCPOOL_PLACEMENT_FLAG_EXTERNAL;
  }
  bool graph() const noexcept { return placement.placement_flags & ARCPOOL_PLACEMENT_FLAG_GRAPH; }
  /// The graph pool that lent this block, or null.
  graph_pool* lender() const noexcept {
    return placement.placement_flags & ARCPOOL_PLACEMENT_FLAG_GRAPH_POOL ? placement.made_by.lender
                                                                         : nullptr;
  }
  /// Graph memory, or a graph pool's block: counted apart from the pool's allocations.
  bool made_in_capture() const noexcept {
    return placement.placement_flags &
           (ARCPOOL_PLACEMENT_FLAG_GRAPH | ARCPOOL_PLACEMENT_FLAG_GRAPH_POOL);
  }

  /// Adds a reference (R).
  void retain() noexcept { refs.increment(); }
  /// Drops a reference; the last one hands the record to its allocator (design.md §3, R = 0).
  void release() noexcept;

  /// "allocation #12 (4096 bytes at 0x7f..)", for messages.
  std::string describe() const;
};

static_assert(
    sizeof(allocation) <= block_list::kHomeOffset &&
        alignof(allocation) <= __STDCPP_DEFAULT_NEW_ALIGNMENT__,
    "an allocation record fits the blocks of the threads' record lists, before their home");

/// Releases one reference of view `handle` (its own count; its last releases the record's).
void release_view(arcpool_allocation* handle) noexcept;

/// Releases one reference through a handle: a view's own count, else the record's (one call).
inline void release_handle(arcpool_allocation* handle) noexcept {
  if (!handle->is_view) {
    handle->record->release();
  } else {
    release_view(handle);
  }
}

/// Adds one reference through a handle.
void retain_handle(arcpool_allocation* handle) noexcept;

}  // namespace arcpool::detail
