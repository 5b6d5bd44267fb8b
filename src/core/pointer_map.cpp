#include "core/pointer_map.hpp"

namespace arcpool::detail {

process_pointer_map g_by_pointer_allocations;

allocation* pointer_map::find(const void* p) const {
  return with_entry(*this, reinterpret_cast<uintptr_t>(p), [](const shard& s, size_t i) {
    allocation* a = s.by_start.value_at(i);
    a->retain();
    return a;
  });
}

}  // namespace arcpool::detail
