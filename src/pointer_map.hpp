// The allocations made through the raw-pointer entry points, by address (interior pointers
// resolve to their allocation).
#pragma once

#include <cstdint>
#include <map>
#include <shared_mutex>

#include "allocation.hpp"

namespace arcpool::detail {

class pointer_map {
 public:
  /// Adds `a` by its data range; the map keeps the caller's claim and reference.
  void insert(allocation* a);
  /// The allocation whose data range contains `p`, with a new reference the caller releases;
  /// null if none.
  allocation* find(const void* p) const;
  /// Removes `a` if present; returns whether it did (the map's reference passes to the caller).
  bool erase(allocation* a);

 private:
  mutable std::shared_mutex mutex_;
  std::map<uintptr_t, allocation*> by_start_;
};

/// The process's map of by-pointer allocations (every device).
pointer_map& by_pointer_allocations();

}  // namespace arcpool::detail
