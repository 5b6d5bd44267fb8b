// Exit safety (design.md §10, "Exit"): the exit hook's listeners, run in the process's own exit.
#include <gtest/gtest.h>

#include <cstdlib>

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

}  // namespace
}  // namespace arcpool::test
