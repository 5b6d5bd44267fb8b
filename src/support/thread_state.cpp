#include "support/thread_state.hpp"

#include <utility>

namespace arcpool::detail {

namespace {

/// Writes the home of a block fresh from the heap.
void set_home(void* p, block_inbox* home) noexcept {
  ::new (static_cast<char*>(p) + block_list::kHomeOffset) block_inbox*(home);
}

}  // namespace

void* block_list::allocate_slow() noexcept {
  block_list& list = this_thread_state().records;
  if (list.st == state::unused) list.open();
  if (list.inbox != nullptr && list.adopt_returned()) return list.allocate();
  void* p = ::operator new(kBlockBytes, std::nothrow);
  if (p == nullptr) return nullptr;
  if (list.inbox != nullptr) list.inbox->refs.fetch_add(1, std::memory_order_relaxed);
  set_home(p, list.inbox);
  return p;
}

void block_list::free_slow(void* p) noexcept {
  if (st == state::unused) {
    open();
    push(p);
    return;
  }
  block_inbox* const home = home_of(p);
  if (home != nullptr && home != inbox) {
    send_home(p, home);
  } else {
    discard(p);  // this thread's own (its list full or closed), or homeless
  }
}

void block_list::open() noexcept {
  // Drains the thread's list when it exits; constructed once per thread, by its first use.
  struct drain_at_exit {
    ~drain_at_exit() { this_thread_state().records.drain(); }
  };
  thread_local drain_at_exit drain;
  (void)drain;
  st = state::active;
  room = kCapacity;
  inbox = new (std::nothrow) block_inbox;
}

bool block_list::adopt_returned() noexcept {
  // A load first: most refills find the inbox empty, and need no locked instruction.
  if (inbox->head.load(std::memory_order_relaxed) == nullptr) return false;
  auto* n = static_cast<node*>(inbox->head.exchange(nullptr, std::memory_order_acquire));
  if (n == nullptr) return false;
  while (n != nullptr) {
    node* const next = n->next;
    if (room != 0) {
      push(n);
    } else {
      discard(n);
    }
    n = next;
  }
  return head != nullptr;
}

void block_list::send_home(void* p, block_inbox* home) noexcept {
  node* const n = static_cast<node*>(p);
  void* old = home->head.load(std::memory_order_relaxed);
  do {
    if (reinterpret_cast<uintptr_t>(old) == kClosed) {
      discard(p);
      return;
    }
    n->next = static_cast<node*>(old);
  } while (!home->head.compare_exchange_weak(old, n, std::memory_order_release,
                                             std::memory_order_relaxed));
}

void block_list::discard(void* p) noexcept {
  block_inbox* const home = home_of(p);
  ::operator delete(p);
  if (home != nullptr && home->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) delete home;
}

void block_list::discard_chain(node* n) noexcept {
  while (n != nullptr) {
    node* const next = n->next;
    discard(n);
    n = next;
  }
}

void block_list::drain() noexcept {
  st = state::exited;
  room = 0;
  discard_chain(std::exchange(head, nullptr));
  if (inbox == nullptr) return;
  block_inbox* const home = inbox;
  inbox = nullptr;
  // Closed from now on: a block sent home after this goes to the heap (send_home).
  discard_chain(static_cast<node*>(
      home->head.exchange(reinterpret_cast<void*>(kClosed), std::memory_order_acquire)));
  if (home->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) delete home;
}

}  // namespace arcpool::detail
