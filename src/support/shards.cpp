#include "support/shards.hpp"

#include <mutex>
#include <vector>

namespace arcpool::detail {
namespace {

/// Shard indices of live threads; an exiting thread gives its index back (its counts stay in
/// the shard and keep adding up: the next owner continues from them).
class slot_table {
 public:
  shard_slot acquire() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!free_.empty()) {
      const size_t i = free_.back();
      free_.pop_back();
      return {i, true};
    }
    if (next_ < kShards - 1) return {next_++, true};
    return {kShards - 1, false};  // overflow: the shared last shard
  }
  void release(shard_slot s) {
    if (!s.exclusive) return;
    std::lock_guard<std::mutex> lock(mutex_);
    free_.push_back(s.index);
  }
  static slot_table& instance() {
    static auto* t = new slot_table();  // leaked: threads may exit during static destruction
    return *t;
  }

 private:
  std::mutex mutex_;
  std::vector<size_t> free_;
  size_t next_ = 0;
};

/// Gives the slot back when the thread exits; constructed once per thread, on first use.
/// Destructors of thread_locals constructed before it run after it and may still count
/// (a per-thread buffer freed at exit): from then on the thread writes the shared last shard,
/// atomically, never the slot another thread may own by then.
struct slot_release {
  ~slot_release() {
    shard_slot& slot = this_thread_state().slot;
    const shard_slot mine = slot;
    slot = shard_slot{kShards - 1, false};
    slot_table::instance().release(mine);
  }
};

}  // namespace

shard_slot assign_thread_shard() noexcept {
  thread_local slot_release release_at_exit;
  (void)release_at_exit;
  shard_slot& slot = this_thread_state().slot;
  slot = slot_table::instance().acquire();
  return slot;
}

}  // namespace arcpool::detail
