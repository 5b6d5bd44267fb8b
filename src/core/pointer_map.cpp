#include "core/pointer_map.hpp"

#include <mutex>

namespace arcpool::detail {

bool pointer_map::insert(allocation* a) {
  std::lock_guard<spinlock> lock(mutex_);
  return by_start_.insert(reinterpret_cast<uintptr_t>(a->placement.data), a->placement.size, a);
}

allocation* pointer_map::find(const void* p) const {
  std::lock_guard<spinlock> lock(mutex_);
  const size_t i = by_start_.locate(reinterpret_cast<uintptr_t>(p));
  if (i == address_table<allocation>::npos) return nullptr;
  allocation* a = by_start_.value_at(i);
  a->retain();
  return a;
}

allocation* pointer_map::take(const void* p) {
  std::lock_guard<spinlock> lock(mutex_);
  const size_t i = by_start_.locate(reinterpret_cast<uintptr_t>(p));
  if (i == address_table<allocation>::npos) return nullptr;
  allocation* a = by_start_.value_at(i);
  by_start_.erase(i);
  return a;
}

pointer_map& by_pointer_allocations() {
  static auto* map = new pointer_map();  // leaked: by-pointer memory may be freed at exit
  return *map;
}

}  // namespace arcpool::detail
