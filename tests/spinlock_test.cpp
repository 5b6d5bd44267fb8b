// The reader-writer spinlock that guards a known stream's liveness (design.md §6, "Retirement"):
// enqueues share it, retirement excludes them, and readers are preferred.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <shared_mutex>
#include <thread>

#include "support/spinlock.hpp"

namespace arcpool::detail {
namespace {

/// Long enough for a thread that could take the lock to have taken it.
void give_it_time() {
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
}

TEST(SharedSpinlock, ReadersHoldItTogether) {
  shared_spinlock lock;
  std::shared_lock<shared_spinlock> first(lock);
  std::atomic<bool> second{false};
  std::thread reader([&] {
    std::shared_lock<shared_spinlock> held(lock);
    second = true;
  });
  reader.join();  // would hang if readers excluded each other
  EXPECT_TRUE(second.load());
}

TEST(SharedSpinlock, AWriterWaitsForEveryReaderAndThenExcludesReaders) {
  shared_spinlock lock;
  int guarded = 0;  // written by the writer only while it holds the lock (TSan checks)
  lock.lock_shared();
  std::atomic<bool> writing{false};
  std::atomic<bool> written{false};
  std::thread writer([&] {
    std::unique_lock<shared_spinlock> held(lock);
    writing = true;
    guarded = 1;
    give_it_time();
    written = true;
  });
  give_it_time();
  EXPECT_FALSE(writing.load()) << "the writer took the lock while a reader held it";
  lock.unlock_shared();
  while (!writing.load())
    std::this_thread::yield();
  {
    std::shared_lock<shared_spinlock> after(lock);  // waits for the writer to finish
    EXPECT_TRUE(written.load()) << "a reader took the lock while the writer held it";
    EXPECT_EQ(1, guarded);
  }
  writer.join();
}

TEST(SharedSpinlock, AReaderDoesNotWaitForAWriterThatHasNotBegun) {
  // A thread holding it shared takes it shared again while a writer waits: with writers
  // preferred that would deadlock (glibc's default rwlock, under std::shared_mutex, prefers
  // readers too).
  shared_spinlock lock;
  lock.lock_shared();
  std::atomic<bool> writing{false};
  std::thread writer([&] {
    std::unique_lock<shared_spinlock> held(lock);
    writing = true;
  });
  give_it_time();
  lock.lock_shared();
  EXPECT_FALSE(writing.load());
  lock.unlock_shared();
  lock.unlock_shared();
  writer.join();
  EXPECT_TRUE(writing.load());
}

}  // namespace
}  // namespace arcpool::detail
