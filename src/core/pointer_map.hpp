// The allocations made through the raw-pointer entry points, by address (interior pointers
// resolve to their allocation).
#pragma once

#include "core/allocation.hpp"
#include "support/address_table.hpp"
#include "support/spinlock.hpp"

namespace arcpool::detail {

/// By data pointer. An exact data pointer (what frameworks free) is one hash probe sequence; an
/// interior pointer is found by a scan of the table, linear in the live by-pointer allocations
/// (design.md §3).
class pointer_map {
 public:
  /// Adds `a` by its data range; the map keeps the caller's claim and reference. False, with
  /// nothing kept, when the table could not grow (no host memory).
  bool insert(allocation* a);
  /// The allocation whose data range contains `p`, with a new reference the caller releases;
  /// null if none.
  allocation* find(const void* p) const;
  /// Removes and returns the allocation whose data range contains `p`, with the map's claim
  /// and reference; null if none. Until the caller puts it back, no other thread finds it, and
  /// putting it back cannot fail (the table never shrinks).
  allocation* take(const void* p);

 private:
  /// A spinlock, not a reader-writer lock: inserts and takes (every allocation and free) write,
  /// and the critical sections are a few probes; a pthread rwlock pair cost ~75 instructions
  /// each, the spinlock ~5.
  mutable spinlock mutex_;
  address_table<allocation> by_start_;
};

/// The process's map of by-pointer allocations (every device).
pointer_map& by_pointer_allocations();

}  // namespace arcpool::detail
