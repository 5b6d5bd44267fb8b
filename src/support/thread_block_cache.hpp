// Per-thread free lists of fixed-size heap blocks: what the allocation records come from, so
// that a fast-path allocation makes no heap allocation (design.md §7).
//
// Each thread keeps up to kCapacity freed blocks of one size. A block freed on another thread
// than the one that allocated it simply joins the freeing thread's list: the blocks are plain
// heap memory of one size, interchangeable between threads, so no remote-free list is needed
// for correctness (the cost is only that a thread that allocates what another frees keeps
// refilling from the heap). A thread's list goes back to the heap when the thread exits; a
// block freed after that, during the thread's own teardown, goes straight to the heap.
// Under AddressSanitizer the lists are bypassed so that a use after free of a record is seen.
#pragma once

#include <cstddef>
#include <new>

namespace arcpool::detail {

#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kThreadBlockCacheEnabled = false;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr bool kThreadBlockCacheEnabled = false;
#else
inline constexpr bool kThreadBlockCacheEnabled = true;
#endif
#else
inline constexpr bool kThreadBlockCacheEnabled = true;
#endif

/// Blocks of `Size` bytes (at most the default new alignment). `Tag` separates the lists of
/// distinct users of one size.
template <size_t Size, class Tag>
class thread_block_cache {
  static_assert(Size >= sizeof(void*), "a free block holds the next pointer");

 public:
  static constexpr size_t kCapacity = 256;

  /// A block of Size bytes; throws std::bad_alloc like operator new.
  static void* allocate() {
    void* p = take_cached();
    return p != nullptr ? p : ::operator new(Size);
  }
  /// As allocate, or null when the heap has no memory.
  static void* allocate(const std::nothrow_t&) noexcept {
    void* p = take_cached();
    return p != nullptr ? p : ::operator new(Size, std::nothrow);
  }

  /// Gives back a block of allocate's, on any thread.
  static void free(void* p) noexcept {
    list& l = this_thread_list();
    if (!kThreadBlockCacheEnabled || l.count >= kCapacity || l.state == list_state::exited) {
      ::operator delete(p);
      return;
    }
    if (l.state == list_state::unused) register_exit();
    node* n = static_cast<node*>(p);
    n->next = l.head;
    l.head = n;
    ++l.count;
  }

 private:
  struct node {
    node* next;
  };
  enum class list_state : unsigned char { unused, active, exited };
  /// Trivially destructible and constant-initialized: reading it is one TLS access.
  struct list {
    node* head;
    size_t count;
    list_state state;
  };
  /// Empties the calling thread's list when it exits (constructed by the first free).
  struct drain_at_exit {
    ~drain_at_exit() {
      list& l = this_thread_list();
      l.state = list_state::exited;
      while (l.head != nullptr) {
        node* n = l.head;
        l.head = n->next;
        ::operator delete(n);
      }
      l.count = 0;
    }
  };
  /// A block from the calling thread's list, or null when it is empty (or bypassed).
  static void* take_cached() noexcept {
    list& l = this_thread_list();
    if (!kThreadBlockCacheEnabled || l.head == nullptr) return nullptr;
    node* n = l.head;
    l.head = n->next;
    --l.count;
    return n;
  }
  static void register_exit() noexcept {
    thread_local drain_at_exit drain;
    (void)drain;
    this_thread_list().state = list_state::active;
  }

  /// The calling thread's list (constant-initialized: no guard, one TLS access).
  static list& this_thread_list() noexcept {
    static thread_local list l{nullptr, 0, list_state::unused};
    return l;
  }
};

}  // namespace arcpool::detail
