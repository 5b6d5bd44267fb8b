// The threads' lists of allocation-record blocks (src/support/thread_state.hpp): a block freed
// on another thread whose list is full goes back to the thread it came from, which reuses it;
// a thread's exit closes its inbox, and a block sent home after that goes to the heap.
#include <gtest/gtest.h>

#include <future>
#include <thread>
#include <vector>

#include "support/thread_state.hpp"

namespace arcpool::detail {
namespace {

/// Fills the calling thread's list with blocks of its own.
void fill_own_list() {
  block_list& list = this_thread_state().records;
  std::vector<void*> own;
  for (size_t i = 0; i < block_list::kCapacity; ++i)
    own.push_back(list.allocate());
  for (void* p : own)
    list.free(p);
}

/// Frees `p` on a new thread whose list is full, so that the block cannot join that list.
/// Returns whether it stayed on that thread's list.
bool free_on_a_thread_with_a_full_list(void* p) {
  bool kept = false;
  std::thread([&] {
    fill_own_list();
    block_list& list = this_thread_state().records;
    EXPECT_EQ(0u, list.room);
    list.free(p);
    kept = list.head == p;
  }).join();
  return kept;
}

TEST(RecordBlocks, ABlockFreedOnAnotherThreadsFullListGoesBackToItsThreadWhichReusesIt) {
  if (!kBlockListEnabled) GTEST_SKIP() << "record lists are bypassed under AddressSanitizer";
  std::promise<void*> allocated;
  std::promise<void> freed;
  std::future<void> freed_done = freed.get_future();
  void* again = nullptr;
  std::thread owner([&] {
    block_list& list = this_thread_state().records;
    void* p = list.allocate();  // a new thread: from the heap, its home this thread's inbox
    ASSERT_NE(nullptr, p);
    EXPECT_NE(nullptr, block_list::home_of(p));
    EXPECT_EQ(list.inbox, block_list::home_of(p));
    allocated.set_value(p);
    freed_done.wait();
    again = list.allocate();  // its list is empty: the inbox's blocks first
    list.free(again);
  });
  void* p = allocated.get_future().get();
  block_inbox* home = block_list::home_of(p);
  EXPECT_FALSE(free_on_a_thread_with_a_full_list(p));
  EXPECT_EQ(p, home->head.load()) << "in its thread's inbox";
  freed.set_value();
  owner.join();
  EXPECT_EQ(p, again) << "its thread took it back from the inbox";
}

TEST(RecordBlocks, ABlockOfAThreadThatExitedGoesToTheHeapAndItsInboxCloses) {
  if (!kBlockListEnabled) GTEST_SKIP() << "record lists are bypassed under AddressSanitizer";
  void* p = nullptr;
  std::thread([&] {
    block_list& list = this_thread_state().records;
    p = list.allocate();
    list.free(list.allocate());  // one block on the list, freed at the exit
  }).join();
  block_inbox* home = block_list::home_of(p);
  ASSERT_NE(nullptr, home);
  EXPECT_EQ(reinterpret_cast<void*>(uintptr_t{1}), home->head.load()) << "closed at the exit";
  EXPECT_EQ(1u, home->refs.load()) << "only the block still out holds the inbox";
  // Sent home to a closed inbox: to the heap, with its reference on the inbox. (The test holds
  // one more, to look at the inbox afterwards; with the block's gone, the inbox would go.)
  home->refs.fetch_add(1);
  EXPECT_FALSE(free_on_a_thread_with_a_full_list(p));
  EXPECT_EQ(reinterpret_cast<void*>(uintptr_t{1}), home->head.load()) << "nothing enters it";
  EXPECT_EQ(1u, home->refs.load());
  if (home->refs.fetch_sub(1) == 1) delete home;
}

TEST(RecordBlocks, AListWithRoomKeepsAnotherThreadsBlockForItsOwnAllocations) {
  if (!kBlockListEnabled) GTEST_SKIP() << "record lists are bypassed under AddressSanitizer";
  void* p = nullptr;
  std::thread([&] { p = this_thread_state().records.allocate(); }).join();
  std::thread([&] {
    block_list& list = this_thread_state().records;
    list.free(p);
    EXPECT_EQ(p, list.head) << "a list with room takes any thread's block: no test on the way";
    EXPECT_EQ(p, list.allocate());
    list.free(p);
  }).join();
}

}  // namespace
}  // namespace arcpool::detail
