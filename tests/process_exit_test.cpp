// Exit safety (design.md §10, "Exit"): the exit hook's listeners, run in the process's own exit.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <thread>

#include "support/process_exit.hpp"

namespace arcpool::test {
namespace {

// A reclaim worker joined by its listener may run a callback that deletes another allocator,
// whose destructor removes that allocator's listener: it must not run then, on a deleted owner.
TEST(ProcessExit, AListenerAnEarlierOneRemovedDoesNotRun) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // a fresh process: only these listeners
  EXPECT_EXIT(
      {
        static int later = 0;
        detail::add_exit_listener([] { detail::remove_exit_listener(later); });
        later = detail::add_exit_listener([] { std::_Exit(3); });
        detail::arm_exit_hook();
        std::exit(0);
      },
      ::testing::ExitedWithCode(0), "");
}

// The exit hook runs a reclaimer's listener while another thread destroys that reclaimer: the
// destructor's removal must wait for the listener to return, or it frees what the listener still
// uses (simcuda-tsan saw the hook's listener inside a destroyed reclaimer's mutex). A second
// listener reports whether the removal returned before the first listener finished.
TEST(ProcessExit, RemovingAListenerTheHookIsRunningWaitsForItToReturn) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        static std::atomic<bool> entered{false};
        static std::atomic<bool> finished{false};
        static std::atomic<int> verdict{-1};
        const int running = detail::add_exit_listener([] {
          entered = true;
          std::this_thread::sleep_for(std::chrono::milliseconds(200));
          finished = true;
        });
        detail::add_exit_listener([] {
          for (int i = 0; i < 1000 && verdict.load() < 0; ++i)
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
          std::_Exit(verdict.load() < 0 ? 5 : verdict.load());
        });
        std::thread([running] {
          while (!entered.load())
            std::this_thread::yield();
          detail::remove_exit_listener(running);
          verdict = finished.load() ? 0 : 4;  // 4: the removal returned under the listener
        }).detach();
        detail::arm_exit_hook();
        std::exit(1);
      },
      ::testing::ExitedWithCode(0), "");
}

// A listener may remove itself: the removal must not wait for the very call it is made from,
// which would never return.
TEST(ProcessExit, AListenerRemovingItselfReturns) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        static int self = 0;
        self = detail::add_exit_listener([] { detail::remove_exit_listener(self); });
        detail::add_exit_listener([] { std::_Exit(0); });
        detail::arm_exit_hook();
        std::exit(1);
      },
      ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace arcpool::test
