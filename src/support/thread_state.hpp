// What the hot path keeps per thread, in one thread-local block, so that an operation looks it
// up once (one TLS descriptor call) and hands it down (design.md §7): the thread's statistics
// shard, its free list of allocation-record blocks, its range of allocation serial numbers and
// its last stream lookups.
#pragma once

#include <cstddef>
#include <cstdint>
#include <new>

#include "arcpool/arcpool.h"

namespace arcpool::detail {

// The stream lookups name the core's stream types without their definitions (core/stream.hpp):
// only pointers and the kind's one byte are kept here.
class stream_entry;
enum class stream_kind : uint8_t;

/// One of the calling thread's last stream lookups (allocator::resolve_stream). A line is
/// valid while its registry's stamp is unchanged. Handles are cached only for streams that
/// cannot be recycled meanwhile: created and registered ones (alive until their removal, which
/// changes the stamp) and the default streams; unregistered application streams are looked
/// up by identity each time.
struct stream_cache_line {
  uint64_t stamp;  ///< stream_registry::stamp() when the line was filled
  arcpool_stream_t handle;
  uint64_t id;
  stream_entry* entry;
  stream_kind kind;
};
/// Lines per thread, direct-mapped on the handle: a lookup reads one line.
inline constexpr size_t kStreamCacheLines = 16;

/// The calling thread's shard (support/shards.hpp): its index, and whether it owns it alone.
struct shard_slot {
  size_t index;
  bool exclusive;
};

#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kBlockListEnabled = false;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr bool kBlockListEnabled = false;
#else
inline constexpr bool kBlockListEnabled = true;
#endif
#else
inline constexpr bool kBlockListEnabled = true;
#endif

/// A thread's free list of fixed-size heap blocks: what allocation records come from, so that a
/// fast-path allocation makes no heap allocation.
///
/// It keeps up to kCapacity freed blocks. A block freed on another thread than the one that
/// allocated it simply joins the freeing thread's list: the blocks are plain heap memory of one
/// size, interchangeable between threads, so no remote-free list is needed for correctness (the
/// cost is only that a thread that allocates what another frees keeps refilling from the heap).
/// The list goes back to the heap when its thread exits; a block freed after that, during the
/// thread's own teardown, goes straight to the heap. Under AddressSanitizer the list is bypassed
/// so that a use after free of a record is seen.
struct block_list {
  static constexpr size_t kBlockBytes = 320;  ///< an allocation record fits (allocation.hpp)
  static constexpr size_t kCapacity = 256;
  enum class state : unsigned char { unused, active, exited };
  struct node {
    node* next;
  };

  node* head;
  /// Blocks the list may still take: kCapacity less the blocks it holds while active, 0 before
  /// the thread's first free and after its exit (so that one test sends those to free_slow).
  size_t room;
  state st;

  /// A block of kBlockBytes, or null when the heap has no memory.
  void* allocate() noexcept {
    if (!kBlockListEnabled || head == nullptr) return ::operator new(kBlockBytes, std::nothrow);
    node* n = head;
    head = n->next;
    ++room;
    return n;
  }
  /// Gives back a block of any thread's list, on this list's thread.
  void free(void* p) noexcept {
    if (!kBlockListEnabled || room == 0) {
      free_slow(p);
      return;
    }
    push(p);
  }
  /// free, when the caller saw room on the list (so that its list is active and enabled).
  void push(void* p) noexcept {
    node* n = static_cast<node*>(p);
    n->next = head;
    head = n;
    --room;
  }
  /// Empties the list into the heap; later frees go straight there.
  void drain() noexcept {
    st = state::exited;
    room = 0;
    while (head != nullptr) {
      node* n = head;
      head = n->next;
      ::operator delete(n);
    }
  }

 private:
  /// The first free of the thread (which arranges the drain at its exit and opens the list), a
  /// full list, or a thread past its exit.
  [[gnu::noinline]] void free_slow(void* p) noexcept;
};

/// One thread's state. Trivially destructible and constant-initialized: reading it is one TLS
/// access with no guard.
struct thread_state {
  /// SIZE_MAX until the thread's first use (shards.hpp, thread_shard).
  shard_slot slot;
  /// The next allocation serial number and the end of the thread's range (allocate.cpp).
  uint64_t next_serial;
  uint64_t serial_end;
  block_list records;                            ///< allocation records' blocks
  stream_cache_line streams[kStreamCacheLines];  ///< the last stream lookups (stream_line)

  /// The line for stream `s`.
  stream_cache_line& stream_line(arcpool_stream_t s) noexcept {
    const auto v = reinterpret_cast<uintptr_t>(s);
    return streams[((v >> 4) ^ (v >> 12)) % kStreamCacheLines];
  }
};

inline thread_local thread_state t_thread_state{{SIZE_MAX, false}, 0, 0, {nullptr, 0, {}}, {}};

/// The calling thread's state. Look it up once per operation and hand the reference down: the
/// empty asm makes its address an opaque value, which the compiler keeps in a register instead
/// of recomputing it (one TLS descriptor call) at every use.
inline thread_state& this_thread_state() noexcept {
  thread_state* ts = &t_thread_state;
  asm("" : "+r"(ts));
  return *ts;
}

}  // namespace arcpool::detail
