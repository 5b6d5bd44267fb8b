#include "core/pointer_map.hpp"

#include <mutex>

namespace arcpool::detail {

void pointer_map::insert(allocation* a) {
  std::lock_guard<spinlock> lock(mutex_);
  by_start_[reinterpret_cast<uintptr_t>(a->placement.data)] = a;
}

pointer_map::map::const_iterator pointer_map::containing(const void* p) const {
  const auto address = reinterpret_cast<uintptr_t>(p);
  auto it = by_start_.upper_bound(address);
  if (it == by_start_.begin()) return by_start_.end();
  --it;
  return address - it->first < it->second->placement.size ? it : by_start_.end();
}

allocation* pointer_map::find(const void* p) const {
  std::lock_guard<spinlock> lock(mutex_);
  const auto it = containing(p);
  if (it == by_start_.end()) return nullptr;
  it->second->retain();
  return it->second;
}

allocation* pointer_map::take(const void* p) {
  std::lock_guard<spinlock> lock(mutex_);
  const auto it = containing(p);
  if (it == by_start_.end()) return nullptr;
  allocation* a = it->second;
  by_start_.erase(it);
  return a;
}

pointer_map& by_pointer_allocations() {
  static auto* map = new pointer_map();  // leaked: by-pointer memory may be freed at exit
  return *map;
}

}  // namespace arcpool::detail
