// The reclaim worker's inbox (core/task_inbox.hpp): a post that notifies without the worker's
// mutex still wakes an idle worker.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <utility>

#include "core/task_inbox.hpp"

namespace arcpool::detail {
namespace {

using std::chrono::steady_clock;

/// Waits until `flag` is set, or `limit` has passed; returns the flag.
bool wait_for_flag(const std::atomic<bool>& flag, std::chrono::milliseconds limit) {
  const auto until = steady_clock::now() + limit;
  while (!flag.load() && steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return flag.load();
}

TEST(TaskInbox, AWorkerThatLookedBeforeAPostWasAnnouncedIsWokenByIt) {
  task_inbox inbox;
  std::mutex mutex;
  std::condition_variable work;
  bool stop = false;  // under mutex
  posted_task task;
  task.run = [](posted_task*) noexcept {};
  std::thread poster;
  std::atomic<bool> posted{false};
  std::atomic<bool> woke{false};
  bool first_look = true;  // the worker's
  std::thread worker([&] {
    std::unique_lock<std::mutex> lock(mutex);
    while (!stop && !inbox.has_tasks()) {
      inbox.wait_idle(
          lock, work, [&] { return stop; },
          [&](bool woken) {
            if (woken || !std::exchange(first_look, false)) return;
            // The worker looked and found nothing. Before it waits, a user object is armed on one
            // thread and destroyed on another (CUDA's), whose post notifies without the mutex: had
            // the announcement not passed through the mutex, this wait would miss that
            // notification.
            poster = std::thread([&] {
              inbox.expect(mutex, work);
              inbox.post(&task, work);
              posted = true;
            });
            wait_for_flag(posted, std::chrono::milliseconds(200));
          });
    }
    woke = true;
  });
  EXPECT_TRUE(wait_for_flag(woke, std::chrono::seconds(5)))
      << "the idle worker slept through a posted task";
  {
    std::lock_guard<std::mutex> lock(mutex);
    stop = true;
  }
  work.notify_all();
  worker.join();
  poster.join();
  EXPECT_TRUE(inbox.outstanding());
  ASSERT_EQ(inbox.take(), &task);
  inbox.finished();
  EXPECT_FALSE(inbox.outstanding());
}

TEST(TaskInbox, TasksAreTakenOldestFirstAndCountedUntilFinished) {
  task_inbox inbox;
  std::mutex mutex;
  std::condition_variable work;
  posted_task first;
  posted_task second;
  EXPECT_FALSE(inbox.outstanding());
  inbox.expect(mutex, work);
  EXPECT_TRUE(inbox.outstanding()) << "an announced post counts before it is made";
  EXPECT_FALSE(inbox.has_tasks());
  inbox.post(&first, work);
  inbox.expect(mutex, work);
  inbox.post(&second, work);
  EXPECT_TRUE(inbox.has_tasks());
  EXPECT_EQ(inbox.unfinished(), 2u);
  posted_task* taken = inbox.take();
  EXPECT_FALSE(inbox.has_tasks());
  ASSERT_EQ(taken, &first);
  ASSERT_EQ(taken->next, &second);
  EXPECT_EQ(second.next, nullptr);
  inbox.finished();
  EXPECT_TRUE(inbox.outstanding()) << "a taken task counts until it ran to its end";
  inbox.finished();
  EXPECT_FALSE(inbox.outstanding());
  EXPECT_EQ(inbox.take(), nullptr);
}

}  // namespace
}  // namespace arcpool::detail
