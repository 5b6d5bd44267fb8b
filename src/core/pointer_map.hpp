// The allocations made through the raw-pointer entry points, by address (interior pointers
// resolve to their allocation).
#pragma once

#include <cstdint>
#include <map>
#include <shared_mutex>

#include "core/allocation.hpp"

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
  /// The entry whose data range contains `p`, or end() (lock held).
  std::map<uintptr_t, allocation*>::const_iterator containing(const void* p) const;

  mutable std::shared_mutex mutex_;
  std::map<uintptr_t, allocation*> by_start_;
};

/// The process's map of by-pointer allocations (every device).
pointer_map& by_pointer_allocations();

}  // namespace arcpool::detail
