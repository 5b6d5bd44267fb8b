// The allocations made through the raw-pointer entry points, by address (interior pointers
// resolve to their allocation).
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>

#include "core/allocation.hpp"
#include "support/address_table.hpp"
#include "support/spinlock.hpp"

namespace arcpool::detail {

/// By data pointer, in shards chosen by the pointer, each a hash table under its own spinlock,
/// so that threads allocating and freeing different pointers do not share a lock or its cache
/// line. An exact data pointer (what frameworks free) is one shard and one hash probe sequence;
/// an interior pointer is found by a scan of every shard, linear in the live by-pointer
/// allocations (design.md §7).
class pointer_map {
 public:
  /// Shards of the map (a power of two).
  static constexpr size_t kShards = 64;

  /// Adds `a` by its data range; the map keeps the caller's claim and reference. False, with
  /// nothing kept, when its shard's table could not grow (no host memory).
  bool insert(allocation* a) {
    const auto start = reinterpret_cast<uintptr_t>(a->placement.data);
    shard& s = shards_[shard_of(start)];
    std::lock_guard<spinlock> lock(s.mutex);
    return s.by_start.insert(start, a->placement.size, a);
  }
  /// The allocation whose data range contains `p`, with a new reference the caller releases;
  /// null if none.
  allocation* find(const void* p) const;
  /// Puts back `a`, taken out by take: as insert, but when its shard's table cannot grow (no
  /// host memory) it goes over the table's half-full limit (address_table::put_back). False,
  /// with nothing kept, only when all but one of the shard's slots are full.
  bool put_back(allocation* a) {
    const auto start = reinterpret_cast<uintptr_t>(a->placement.data);
    shard& s = shards_[shard_of(start)];
    std::lock_guard<spinlock> lock(s.mutex);
    return s.by_start.put_back(start, a->placement.size, a);
  }
  /// Removes and returns the allocation whose data range contains `p`, with the map's claim
  /// and reference; null if none. Until the caller puts it back (put_back), no other thread
  /// finds it.
  allocation* take(const void* p) {
    return with_entry(*this, reinterpret_cast<uintptr_t>(p), [](shard& s, size_t i) {
      allocation* a = s.by_start.value_at(i);
      s.by_start.erase(i);
      return a;
    });
  }

 private:
  /// One shard, alone on its cache lines. A spinlock, not a reader-writer lock: inserts and
  /// takes (every allocation and free) write, and the critical sections are a few probes; a
  /// pthread rwlock pair cost ~75 instructions each, the spinlock ~5.
  struct alignas(64) shard {
    mutable spinlock mutex;
    address_table<allocation> by_start;
  };
  static_assert(alignof(shard) == 64 && sizeof(shard) % 64 == 0,
                "each shard of the by-pointer map fills whole cache lines of its own");

  /// The shard of data pointer `start`: bits of its Fibonacci hash that address_table's home
  /// slot does not use, so that one shard's entries still spread over its table.
  static size_t shard_of(uintptr_t start) noexcept {
    return static_cast<size_t>((static_cast<uint64_t>(start) * 0x9E3779B97F4A7C15ull) >> 58) &
           (kShards - 1);
  }
  /// Runs `fn(shard, index)` under the lock of the shard of `map` (a pointer_map, const or
  /// not) whose entry contains `address`: its own shard's probe sequence for an exact start,
  /// else a scan of every shard (out of line: frameworks free exact pointers). Returns `fn`'s
  /// result; null when no shard has one.
  template <class Map, class F>
  static allocation* with_entry(Map& map, uintptr_t address, F&& fn) {
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
  [[gnu::noinline]] static allocation* with_interior_entry(Map& map, uintptr_t address, F&& fn) {
    // Its allocation starts below it, in any shard.
    for (auto& s : map.shards_) {
      std::lock_guard<spinlock> lock(s.mutex);
      if (const size_t i = s.by_start.locate(address); i != address_table<allocation>::npos) {
        return fn(s, i);
      }
    }
    return nullptr;
  }

  shard shards_[kShards];
};

/// The process's map of by-pointer allocations: constant-initialized, so that using it tests no
/// guard, and never destroyed, since by-pointer memory may be freed during the process's exit.
union process_pointer_map {
  constexpr process_pointer_map() : map() {}
  ~process_pointer_map() {}
  pointer_map map;
};
extern process_pointer_map g_by_pointer_allocations;

/// The process's map of by-pointer allocations (every device).
inline pointer_map& by_pointer_allocations() {
  return g_by_pointer_allocations.map;
}

}  // namespace arcpool::detail
