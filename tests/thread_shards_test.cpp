// The per-thread shards that statistics and record counts are kept in (support/shards.hpp): a
// thread that owns a slot writes it with plain stores, so no other thread may write it as well;
// and the count of live records, whose zero the janitor trusts while threads still count.
#include <gtest/gtest.h>

#include <thread>

#include "support/shards.hpp"

namespace arcpool::detail {
namespace {

/// Reads the thread's slot from its destructor, which runs after the slot was given back when
/// the probe was constructed before the slot was assigned.
struct slot_probe {
  shard_slot* seen = nullptr;
  ~slot_probe() {
    if (seen != nullptr) *seen = thread_shard();
  }
};

TEST(ThreadShards, AThreadThatGaveItsSlotBackAtExitCountsOnTheSharedShardAfterwards) {
  shard_slot while_running{SIZE_MAX, false};
  shard_slot after_release{SIZE_MAX, false};
  std::thread([&] {
    thread_local slot_probe probe;  // first: destroyed after the slot's release at exit
    probe.seen = &after_release;
    while_running = thread_shard();
  }).join();
  if (!while_running.exclusive) GTEST_SKIP() << "every exclusive slot is taken by other threads";
  // The index may already be another thread's: a plain store there would lose its updates.
  EXPECT_FALSE(after_release.exclusive);
  EXPECT_EQ(after_release.index, kShards - 1);
}

TEST(ThreadShards, ACounterKeepsTheCountsOfAThreadsExitDestructors) {
  sharded_counter counter;
  struct add_at_exit {
    sharded_counter* counter = nullptr;
    ~add_at_exit() {
      if (counter != nullptr) counter->add(1);
    }
  };
  std::thread([&] {
    thread_local add_at_exit late;
    late.counter = &counter;
    counter.add(1);
  }).join();
  EXPECT_EQ(counter.sum(), 2);
}

TEST(LiveCount, ReadsNoZeroWhenAnObjectMadeAfterItsShardWasReadOutlivesOneRemovedLater) {
  // One object live, counted in a slot read after this thread's. While zero() reads, this
  // thread's slot, read already, gains a racing object, and the first object goes from the
  // later slot: one object is live throughout, though the shards read add up to nothing.
  const shard_slot mine = thread_shard();
  if (mine.index + 1 >= kShards) GTEST_SKIP() << "this thread counts in the last slot";
  const size_t first = mine.index;
  const size_t last = mine.index + 1;
  live_count count;
  count.add(shard_slot{last, false}, 1);
  bool raced = false;
  const bool zero = count.zero([&](size_t read) {
    if (read == first && !raced) {
      raced = true;
      count.add_racing();  // in this thread's slot, read already
      count.remove_release(shard_slot{last, false});
    }
  });
  ASSERT_TRUE(raced);
  EXPECT_FALSE(zero) << "a live object read as none";
  EXPECT_FALSE(count.zero());
  count.remove_release(mine);
  EXPECT_TRUE(count.zero());
}

TEST(LiveCount, ReadsZeroOnceEveryObjectIsGoneOnWhicheverThreadsTheyCameAndWent) {
  live_count count;
  EXPECT_TRUE(count.zero());
  std::thread([&] {
    count.add();
    count.add_racing();
  }).join();
  EXPECT_FALSE(count.zero());
  count.remove_release(thread_shard(), 2);
  EXPECT_TRUE(count.zero());
}

}  // namespace
}  // namespace arcpool::detail
