// The allocations made through the raw-pointer entry points, by address (interior pointers
// resolve to their allocation).
#pragma once

#include <cstdint>
#include <map>

#include "core/allocation.hpp"
#include "support/spinlock.hpp"
#include "support/thread_block_cache.hpp"

namespace arcpool::detail {

class pointer_map {
 public:
  /// Adds `a` by its data range; the map keeps the caller's claim and reference.
  void insert(allocation* a);
  /// The allocation whose data range contains `p`, with a new reference the caller releases;
  /// null if none.
  allocation* find(const void* p) const;
  /// Removes and returns the allocation whose data range contains `p`, with the map's claim
  /// and reference; null if none. Until the caller puts it back, no other thread finds it.
  allocation* take(const void* p);

 private:
  struct node_tag;
  /// Its nodes come from the threads' free lists: no heap call per allocation once warm.
  using map = std::map<uintptr_t, allocation*, std::less<uintptr_t>,
                       thread_block_allocator<std::pair<const uintptr_t, allocation*>, node_tag>>;
  /// The entry whose data range contains `p`, or end() (lock held).
  map::const_iterator containing(const void* p) const;

  /// A spinlock, not a reader-writer lock: inserts and takes (every allocation and free) write,
  /// and the critical sections are a tree operation; a pthread rwlock pair cost ~75
  /// instructions each, the spinlock ~5.
  mutable spinlock mutex_;
  map by_start_;
};

/// The process's map of by-pointer allocations (every device).
pointer_map& by_pointer_allocations();

}  // namespace arcpool::detail
