#include "support/shards.hpp"

#include <mutex>
#include <type_traits>

#include "support/spinlock.hpp"

namespace arcpool::detail {
namespace {

/// Shard indices of live threads; an exiting thread gives its index back (its counts stay in
/// the shard and keep adding up: the next owner continues from them). It allocates nothing and
/// throws nothing, since a thread takes its index in a noexcept function and gives it back in a
/// destructor at its exit, also when the host has no memory left; and it has no destructor, so
/// threads may exit during static destruction.
class slot_table {
 public:
  shard_slot acquire() noexcept {
    std::lock_guard<spinlock> lock(lock_);
    if (free_count_ != 0) return {free_[--free_count_], true};
    if (next_ < kShards - 1) return {next_++, true};
    return {kShards - 1, false};  // overflow: the shared last shard
  }
  void release(shard_slot s) noexcept {
    if (!s.exclusive) return;
    std::lock_guard<spinlock> lock(lock_);
    free_[free_count_++] = s.index;  // each of the kShards - 1 indices is given back once
  }

 private:
  spinlock lock_;  // taken only when a thread starts using arcpool, and when it exits
  size_t free_[kShards - 1] = {};
  size_t free_count_ = 0;
  size_t next_ = 0;
};
static_assert(std::is_trivially_destructible_v<slot_table>,
              "no destructor: a thread may exit after static destruction began");

slot_table g_slots;  // constant-initialized: ready before any thread's first use

/// Gives the slot back when the thread exits; constructed once per thread, on first use.
/// Destructors of thread_locals constructed before it run after it and may still count
/// (a per-thread buffer freed at exit): from then on the thread writes the shared last shard,
/// atomically, never the slot another thread may own by then.
struct slot_release {
  ~slot_release() {
    shard_slot& slot = this_thread_state().slot;
    const shard_slot mine = slot;
    slot = shard_slot{kShards - 1, false};
    g_slots.release(mine);
  }
};

}  // namespace

shard_slot assign_thread_shard() noexcept {
  thread_local slot_release release_at_exit;
  (void)release_at_exit;
  shard_slot& slot = this_thread_state().slot;
  slot = g_slots.acquire();
  return slot;
}

}  // namespace arcpool::detail
