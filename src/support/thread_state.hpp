// What the hot path keeps per thread, in one thread-local block, so that an operation looks it
// up once (one TLS descriptor call) and hands it down (design.md §7): the thread's statistics
// shard, its free list of allocation-record blocks, its range of allocation serial numbers and
// its last stream lookups.
#pragma once

#include <atomic>
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

/// Where the record blocks of one thread come back when other threads free them (mimalloc's
/// remote-free list): a stack that any thread pushes onto and the owning thread takes whole.
/// It lives on the heap, apart from its thread, so that blocks freed after the thread exited
/// still find it: it goes when both its thread has exited and no block names it any longer.
struct alignas(64) block_inbox {
  /// The returned blocks, a chain through their first word; block_list::kClosed once the
  /// thread exited.
  std::atomic<void*> head{nullptr};
  /// One for the owning thread until its exit, and one for every block that names this inbox.
  std::atomic<size_t> refs{1};
};

/// A thread's free list of fixed-size heap blocks: what allocation records come from, so that a
/// fast-path allocation makes no heap allocation.
///
/// Each block names, in its last word, the inbox of the thread that took it from the heap (its
/// home). A block freed on any thread joins that thread's list while the list has room
/// (kCapacity); past that, a block of another thread goes back to its home's inbox, and the
/// home thread takes the whole inbox when its list runs dry. So a thread that allocates records
/// that other threads release (a producer; a forward pass whose backward runs on other threads)
/// reuses its own blocks instead of refilling from the heap, and the common free, on a list
/// with room, tests nothing else. Blocks sent home wait in the inbox until their thread's list
/// runs dry (at most the blocks that thread ever took from the heap). When its thread exits,
/// the blocks of its list and of its inbox go back to the heap and the inbox closes: a block
/// sent home after that goes to the heap, and the last of them deletes the inbox. Under
/// AddressSanitizer the list is bypassed (and blocks name no home) so that a use after free of
/// a record is seen.
struct block_list {
  static constexpr size_t kBlockBytes = 320;  ///< an allocation record and its home
  /// Where a block names its home; a record must end before it (allocation.hpp).
  static constexpr size_t kHomeOffset = kBlockBytes - sizeof(block_inbox*);
  static constexpr size_t kCapacity = 256;
  enum class state : unsigned char { unused, active, exited };
  struct node {
    node* next;
  };

  node* head;
  /// Blocks the list may still take: kCapacity less the blocks it holds while active, 0 before
  /// the thread's first use and after its exit (so that one test sends those to the slow path).
  size_t room;
  state st;
  /// This thread's inbox: the home of the blocks it takes from the heap. Null before the
  /// thread's first use, after its exit, and if no host memory was left for it (its blocks
  /// then name no home and go back to the heap from any thread).
  block_inbox* inbox;

  /// A block of kBlockBytes, or null when the heap has no memory.
  void* allocate() noexcept {
    if (!kBlockListEnabled) return ::operator new(kBlockBytes, std::nothrow);
    if (head == nullptr) return allocate_slow();
    node* n = head;
    head = n->next;
    ++room;
    return n;
  }
  /// Gives back a block of any thread's list, on this list's thread.
  void free(void* p) noexcept {
    if (!kBlockListEnabled) {
      ::operator delete(p);
    } else if (room != 0) {
      push(p);
    } else {
      free_slow(p);
    }
  }
  /// free, when the list has room.
  void push(void* p) noexcept {
    node* n = static_cast<node*>(p);
    n->next = head;
    head = n;
    --room;
  }
  /// Empties the list and closes the inbox, at the thread's exit; later frees go to the heap.
  void drain() noexcept;

  /// The inbox `p` names (null: none).
  static block_inbox* home_of(void* p) noexcept {
    return *std::launder(reinterpret_cast<block_inbox**>(static_cast<char*>(p) + kHomeOffset));
  }

 private:
  /// The chain head of a closed inbox, as an address.
  static constexpr uintptr_t kClosed = 1;

  /// allocate, on the calling thread's empty list: the blocks returned to its inbox, else a
  /// block from the heap, which names the inbox (opening the list on the thread's first use).
  /// Static, so that allocate's caller keeps no pointer to the list for it.
  [[gnu::noinline]] static void* allocate_slow() noexcept;
  /// A block freed while the list has no room: on the thread's first use (the list opens and
  /// takes it), or when the list is full or closed: another thread's block goes back to its
  /// home, this thread's own or a homeless one to the heap.
  [[gnu::noinline]] void free_slow(void* p) noexcept;
  /// Opens the list: arranges its drain at the thread's exit and makes its inbox.
  void open() noexcept;
  /// Puts the blocks returned to this thread's inbox on the list, as far as its room goes; the
  /// rest to the heap. False when the list is still empty.
  bool adopt_returned() noexcept;
  /// Sends `p` to its home's inbox, or to the heap if that inbox has closed.
  static void send_home(void* p, block_inbox* home) noexcept;
  /// Gives `p` back to the heap, with its home's reference.
  static void discard(void* p) noexcept;
  /// discard, for each block of the chain that starts at `n`.
  static void discard_chain(node* n) noexcept;
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

inline thread_local thread_state t_thread_state{
    {SIZE_MAX, false}, 0, 0, {nullptr, 0, {}, nullptr}, {}};

/// The calling thread's state. Look it up once per operation and hand the reference down: the
/// empty asm makes its address an opaque value, which the compiler keeps in a register instead
/// of recomputing it (one TLS descriptor call) at every use.
inline thread_state& this_thread_state() noexcept {
  thread_state* ts = &t_thread_state;
  asm("" : "+r"(ts));
  return *ts;
}

}  // namespace arcpool::detail
