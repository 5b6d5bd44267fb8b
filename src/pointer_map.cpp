#include "pointer_map.hpp"

#include <mutex>

namespace arcpool::detail {

void pointer_map::insert(allocation* a) {
  std::unique_lock<std::shared_mutex> lock(mutex_);
  by_start_[reinterpret_cast<uintptr_t>(a->placement.data)] = a;
}

allocation* pointer_map::find(const void* p) const {
  const auto address = reinterpret_cast<uintptr_t>(p);
  std::shared_lock<std::shared_mutex> lock(mutex_);
  auto it = by_start_.upper_bound(address);
  if (it == by_start_.begin()) return nullptr;
  --it;
  allocation* a = it->second;
  if (address - it->first >= a->placement.size) return nullptr;
  a->retain();
  return a;
}

bool pointer_map::erase(allocation* a) {
  std::unique_lock<std::shared_mutex> lock(mutex_);
  auto it = by_start_.find(reinterpret_cast<uintptr_t>(a->placement.data));
  if (it == by_start_.end() || it->second != a) return false;
  by_start_.erase(it);
  return true;
}

pointer_map& by_pointer_allocations() {
  static auto* map = new pointer_map();  // leaked: by-pointer memory may be freed at exit
  return *map;
}

}  // namespace arcpool::detail
