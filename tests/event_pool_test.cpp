// design.md §6: an event whose record failed (a capture began meanwhile) is destroyed, never
// returned to the event pool, so that no later fence reuses an event a capture may hold
// (src/core/fence.cpp; issue 9). On every driver; the deterministic driver also counts the live
// events, which tells "destroyed" from "leaked".
#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "core/fence.hpp"
#include "drivers/deterministic.hpp"
#include "support/driver_test.hpp"

namespace arcpool::test {
namespace {

class EventPool : public DriverTest {
 protected:
  void SetUp() override {
    DriverTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    s_ = make_stream();
  }
  size_t live_events() const { return detail::deterministic::live_events(core().drv()); }

  arcpool_stream_t s_ = nullptr;
};

/// A small pool, so that a shard fills (a capacity of 64 or less is each shard's).
class SmallEventPool : public EventPool {
 protected:
  static constexpr size_t kShardCapacity = 8;
  void customize(arcpool_allocator_options_t& options) override {
    options.event_pool_capacity = kShardCapacity;
  }
};

TEST_P(SmallEventPool, FencesReleasedOnAThreadThatTookNoneGoBackToTheThreadThatTookThem) {
  // Fences taken here and released on another thread that never took one (as the reclaim
  // worker releases a deferred free's fences): that thread's shard has no room reserved, so
  // they come back here, and this thread's next fences reuse their events instead of creating
  // new ones.
  std::vector<detail::fence_ref> taken(kShardCapacity);
  for (detail::fence_ref& f : taken)
    ASSERT_OK(core().events().record(s_, 0, &f));
  ASSERT_EQ(kShardCapacity, core().events().events_created());
  std::thread([&] { taken.clear(); }).join();
  std::vector<detail::fence_ref> again(kShardCapacity);
  for (detail::fence_ref& f : again)
    ASSERT_OK(core().events().record(s_, 0, &f));
  EXPECT_EQ(kShardCapacity, core().events().events_created())
      << "the events released on the other thread came back here";
  if (deterministic()) {
    EXPECT_EQ(kShardCapacity, live_events()) << "none destroyed, none leaked";
  }
}

TEST_P(SmallEventPool, FencesReleasedPastAnotherThreadsFullShardGoBackToTheThreadThatTookThem) {
  // The other thread took a fence of its own, so its shard has room for a capacity: it keeps
  // that many of this thread's fences, and the rest come back here.
  constexpr size_t kFences = 2 * kShardCapacity;
  std::vector<detail::fence_ref> taken(kFences);
  for (detail::fence_ref& f : taken)
    ASSERT_OK(core().events().record(s_, 0, &f));
  std::thread([&] {
    detail::fence_ref own;
    ASSERT_OK(core().events().record(s_, 0, &own));
    taken.clear();
    if (deterministic()) {
      EXPECT_EQ(kFences + 1, live_events()) << "none destroyed, none leaked";
    }
  }).join();  // `own` goes last, into a full shard of its own: destroyed
  ASSERT_EQ(kFences + 1, core().events().events_created());
  std::vector<detail::fence_ref> again(kFences - kShardCapacity);
  for (detail::fence_ref& f : again)
    ASSERT_OK(core().events().record(s_, 0, &f));
  EXPECT_EQ(kFences + 1, core().events().events_created())
      << "the events the other thread had no room for came back here";
}

TEST_P(SmallEventPool, AtMostAShardsCapacityOfFencesWaitsToGoBack) {
  constexpr size_t kFences = 3 * kShardCapacity;
  std::vector<detail::fence_ref> taken(kFences);
  for (detail::fence_ref& f : taken)
    ASSERT_OK(core().events().record(s_, 0, &f));
  std::thread([&] { taken.clear(); }).join();
  if (deterministic()) {
    EXPECT_EQ(kShardCapacity, live_events())
        << "the other thread, which took no fence, keeps none, a capacity's worth waits to come "
           "back here, and the rest are destroyed";
  }
  std::vector<detail::fence_ref> again(2 * kShardCapacity);
  for (detail::fence_ref& f : again)
    ASSERT_OK(core().events().record(s_, 0, &f));
  EXPECT_EQ(kFences + kShardCapacity, core().events().events_created())
      << "a capacity's worth came back, the rest were new";
}

TEST_P(SmallEventPool, FencesReleasedOnTheirOwnThreadsFullShardAreDestroyed) {
  constexpr size_t kFences = 2 * kShardCapacity;
  std::vector<detail::fence_ref> taken(kFences);
  for (detail::fence_ref& f : taken)
    ASSERT_OK(core().events().record(s_, 0, &f));
  taken.clear();
  if (deterministic()) {
    EXPECT_EQ(kShardCapacity, live_events()) << "the shard keeps its capacity, no more";
  }
}

TEST_P(EventPool, AnEventWhoseRecordFailedIsDestroyedNotPooled) {
  detail::fence_ref first;
  ASSERT_OK(core().events().record(s_, 0, &first));
  first = detail::fence_ref();  // back to the pool: the next record takes this event
  EXPECT_EQ(1u, core().events().events_created());
  if (deterministic()) {
    EXPECT_EQ(1u, live_events());
  }
  ASSERT_OK(core().drv().stream_begin_capture(s_));
  if (!on_host()) {
    // CUDA records events on a capturing stream (they become captured events); a record fails
    // once the capture is invalidated, here by synchronizing the capturing stream.
    EXPECT_STATUS(ARCPOOL_STATUS_UNSUPPORTED, core().drv().stream_synchronize(s_));
  }
  detail::fence_ref failed;
  EXPECT_STATUS(ARCPOOL_STATUS_UNSUPPORTED, core().events().record(s_, 0, &failed))
      << "the pooled event's record fails on a capturing stream";
  EXPECT_FALSE(failed);
  if (deterministic()) {
    EXPECT_EQ(0u, live_events()) << "the failed event was not destroyed";
  }
  core().drv().stream_end_capture(s_);
  detail::fence_ref next;
  ASSERT_OK(core().events().record(s_, 0, &next));
  EXPECT_EQ(2u, core().events().events_created()) << "the failed event was pooled and reused";
  if (deterministic()) {
    EXPECT_EQ(1u, live_events());
  }
}

/// docs/graphs.md: the reclaim worker fences a stream that captured once only while it does not
/// capture; a fence it cannot take then is no fence, and no event enters a capture for it.
TEST_P(EventPool, AFenceOutsideCaptureIsNotTakenOnACapturingStream) {
  ASSERT_OK(core().drv().stream_begin_capture(s_));
  detail::fence_ref f;
  bool capturing = false;
  ASSERT_OK(core().events().record_outside_capture(s_, 0, &f, &capturing));
  EXPECT_TRUE(capturing);
  EXPECT_FALSE(f);
  EXPECT_EQ(0u, core().events().events_created()) << "no event recorded into the capture";
  ASSERT_OK(core().drv().stream_end_capture(s_));
  ASSERT_OK(core().events().record_outside_capture(s_, 0, &f, &capturing));
  EXPECT_FALSE(capturing);
  EXPECT_TRUE(f);
}

ARCPOOL_INSTANTIATE_FOR_ALL_DRIVERS(EventPool);
ARCPOOL_INSTANTIATE_FOR_ALL_DRIVERS(SmallEventPool);

}  // namespace
}  // namespace arcpool::test
