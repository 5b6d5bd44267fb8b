#include "core/pointer_map.hpp"

#include <mutex>

namespace arcpool::detail {

bool pointer_map::insert(allocation* a) {
  const auto start = reinterpret_cast<uintptr_t>(a->placement.data);
  shard& s = shards_[shard_of(start)];
  std::lock_guard<spinlock> lock(s.mutex);
  return s.by_start.insert(start, a->placement.size, a);
}

template <class Map, class F>
allocation* pointer_map::with_entry(Map& map, uintptr_t address, F&& fn) {
  {
    auto& s = map.shards_[shard_of(address)];
    std::lock_guard<spinlock> lock(s.mutex);
    if (const size_t i = s.by_start.find_start(address); i != address_table<allocation>::npos) {
      return fn(s, i);
    }
  }
  return with_interior_entry(map, address, fn);
}

template <class Map, class F>
allocation* pointer_map::with_interior_entry(Map& map, uintptr_t address, F&& fn) {
  // Its allocation starts below it, in any shard.
  for (auto& s : map.shards_) {
    std::lock_guard<spinlock> lock(s.mutex);
    if (const size_t i = s.by_start.locate(address); i != address_table<allocation>::npos) {
      return fn(s, i);
    }
  }
  return nullptr;
}

allocation* pointer_map::find(const void* p) const {
  return with_entry(*this, reinterpret_cast<uintptr_t>(p), [](const shard& s, size_t i) {
    allocation* a = s.by_start.value_at(i);
    a->retain();
    return a;
  });
}

allocation* pointer_map::take(const void* p) {
  return with_entry(*this, reinterpret_cast<uintptr_t>(p), [](shard& s, size_t i) {
    allocation* a = s.by_start.value_at(i);
    s.by_start.erase(i);
    return a;
  });
}

pointer_map& by_pointer_allocations() {
  static auto* map = new pointer_map();  // leaked: by-pointer memory may be freed at exit
  return *map;
}

}  // namespace arcpool::detail
