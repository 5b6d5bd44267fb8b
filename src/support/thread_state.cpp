#include "support/thread_state.hpp"

namespace arcpool::detail {

void block_list::free_slow(void* p) noexcept {
  if (kBlockListEnabled && st == state::unused) {
    // Drains the thread's list when it exits; constructed once per thread, by its first free.
    struct drain_at_exit {
      ~drain_at_exit() { this_thread_state().records.drain(); }
    };
    thread_local drain_at_exit drain;
    (void)drain;
    st = state::active;
    room = kCapacity;
    free(p);
    return;
  }
  ::operator delete(p);
}

}  // namespace arcpool::detail
