// The host driver's own contract (design.md §8): in-order workers, events whose waits capture
// the state at the call, frees that execute in stream order, driver calls refused inside host
// work. Host-only by nature.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>

#include "drivers/driver.hpp"
#include "drivers/host_stream.hpp"
#include "support/driver_test.hpp"

namespace arcpool::test {
namespace {

class HostDriver : public ::testing::Test {
 protected:
  void SetUp() override {
    detail::driver_config config;
    config.kind = ARCPOOL_DRIVER_HOST;
    config.host_capacity_bytes = 8 << 20;
    arcpool_status_t status = ARCPOOL_STATUS_SUCCESS;
    drv_ = detail::make_host_driver(config, &status);
    ASSERT_OK(status);
    ASSERT_OK(drv_->stream_create(&a_));
    ASSERT_OK(drv_->stream_create(&b_));
    ASSERT_OK(drv_->event_create(&e_));
  }
  void TearDown() override {
    drv_->stream_synchronize(a_);
    drv_->stream_synchronize(b_);
    drv_->event_destroy(e_);
    drv_->stream_destroy(a_);
    drv_->stream_destroy(b_);
  }

  /// Holds `s` until the returned flag is set.
  std::shared_ptr<std::atomic<bool>> hold(arcpool_stream_t s) {
    auto open = std::make_shared<std::atomic<bool>>(false);
    auto* held = new std::shared_ptr<std::atomic<bool>>(open);
    EXPECT_OK(drv_->launch_host_func(
        s,
        [](void* p) {
          auto* flag = static_cast<std::shared_ptr<std::atomic<bool>>*>(p);
          detail::host_work_blocking blocking({}, [open = *flag] { return open->load(); });
          while (!(*flag)->load())
            std::this_thread::yield();
          delete flag;
        },
        held));
    return open;
  }

  std::unique_ptr<detail::driver> drv_;
  arcpool_stream_t a_ = nullptr;
  arcpool_stream_t b_ = nullptr;
  detail::event_handle e_ = nullptr;
};

TEST_F(HostDriver, SettleWaitsOutAWaitThatCanEndWithoutFollowingItsStream) {
  // b's worker is in a wait on a that can end already, and takes 300 ms to leave it (as a
  // worker descheduled after its event completed); a waits on b's work after that. settle(a)
  // follows a's wait to b, and must wait b's out there, not follow it back to a: that led back
  // to b, a level deeper each time, until the stack ran out.
  const std::shared_ptr<detail::host_stream> a = detail::host_stream_find(a_);
  const std::shared_ptr<detail::host_stream> b = detail::host_stream_find(b_);
  ASSERT_NE(nullptr, a);
  ASSERT_NE(nullptr, b);
  auto b_in_wait = std::make_shared<std::atomic<bool>>(false);
  auto b_done = std::make_shared<std::atomic<bool>>(false);
  b->enqueue([weak_a = std::weak_ptr<detail::host_stream>(a), b_in_wait, b_done] {
    {
      detail::host_work_blocking blocking(weak_a, [] { return true; });
      *b_in_wait = true;
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
    }
    *b_done = true;
  });
  while (!b_in_wait->load())
    std::this_thread::yield();
  a->enqueue([weak_b = std::weak_ptr<detail::host_stream>(b), b_done] {
    detail::host_work_blocking blocking(weak_b, [b_done] { return b_done->load(); });
    while (!b_done->load())
      std::this_thread::yield();
  });
  a->settle();
  EXPECT_TRUE(b_done->load()) << "settle returned while a waited on b, which could progress";
  a->synchronize();
}

TEST_F(HostDriver, AWaitCapturesTheEventsRecordAtTheCall) {
  auto a_open = hold(a_);
  ASSERT_OK(drv_->event_record(e_, a_));       // record #1: after a's hold
  ASSERT_OK(drv_->stream_wait_event(b_, e_));  // b waits for record #1
  ASSERT_OK(drv_->event_record(e_, b_));       // record #2 on b, which will complete first... if
                                               // the wait had not captured #1
  bool done = true;
  ASSERT_OK(drv_->event_query(e_, &done));
  EXPECT_FALSE(done);
  detail::host_stream_find(b_)->settle();
  ASSERT_OK(drv_->event_query(e_, &done));
  EXPECT_FALSE(done) << "b passed its wait although record #1 had not completed";
  a_open->store(true);
  ASSERT_OK(drv_->event_synchronize(e_));
  ASSERT_OK(drv_->event_query(e_, &done));
  EXPECT_TRUE(done);
}

TEST_F(HostDriver, SettleReturnsOnlyWhenTheStreamCannotProgress) {
  auto a_open = hold(a_);
  ASSERT_OK(drv_->event_record(e_, a_));
  ASSERT_OK(drv_->stream_wait_event(b_, e_));
  std::atomic<bool> ran{false};
  ASSERT_OK(drv_->launch_host_func(
      b_, [](void* p) { static_cast<std::atomic<bool>*>(p)->store(true); }, &ran));
  detail::host_stream_find(b_)->settle();
  EXPECT_FALSE(ran.load()) << "b passed a wait on a stream held by the test";
  // Now b's wait is merely slow: a runs on and completes the event. Settling b waits it out.
  a_open->store(true);
  detail::host_stream_find(b_)->settle();
  EXPECT_TRUE(ran.load()) << "settle returned while b waited on a stream that could progress";
}

TEST_F(HostDriver, AnEventNeverRecordedIsComplete) {
  bool done = false;
  ASSERT_OK(drv_->event_query(e_, &done));
  EXPECT_TRUE(done);
  ASSERT_OK(drv_->stream_wait_event(a_, e_));
  ASSERT_OK(drv_->stream_synchronize(a_));
}

TEST_F(HostDriver, FreedMemoryGoesBackWhenTheFreeExecutes) {
  void* p = nullptr;
  ASSERT_OK(drv_->pool_allocate(1 << 20, a_, &p));
  EXPECT_EQ(uint64_t{1} << 20, drv_->pool_query().used_current);
  auto open = hold(a_);
  ASSERT_OK(drv_->pool_free(p, 1 << 20, a_));
  detail::host_stream_find(a_)->settle();
  EXPECT_EQ(uint64_t{1} << 20, drv_->pool_query().used_current) << "freed before stream order";
  open->store(true);
  ASSERT_OK(drv_->stream_synchronize(a_));
  EXPECT_EQ(0u, drv_->pool_query().used_current);
  EXPECT_EQ(uint64_t{1} << 20, drv_->pool_query().reserved_peak);
}

TEST_F(HostDriver, TheSimulatedCapacityIsEnforced) {
  void* p = nullptr;
  void* q = nullptr;
  ASSERT_OK(drv_->pool_allocate(6 << 20, a_, &p));
  EXPECT_STATUS(ARCPOOL_STATUS_OUT_OF_MEMORY, drv_->pool_allocate(4 << 20, a_, &q));
  ASSERT_OK(drv_->pool_free(p, 6 << 20, a_));
  ASSERT_OK(drv_->stream_synchronize(a_));
  ASSERT_OK(drv_->pool_allocate(4 << 20, a_, &q));
  ASSERT_OK(drv_->pool_free(q, 4 << 20, a_));
}

struct refusal {
  detail::driver* drv;
  std::atomic<int> status{-1};
};

TEST_F(HostDriver, DriverCallsFromInsideHostWorkAreRefused) {
  refusal r{drv_.get()};
  ASSERT_OK(drv_->launch_host_func(
      a_,
      [](void* p) {
        auto* re = static_cast<refusal*>(p);
        void* out = nullptr;
        re->status = re->drv->pool_allocate(64, nullptr, &out);
      },
      &r));
  ASSERT_OK(drv_->stream_synchronize(a_));
  EXPECT_EQ(ARCPOOL_STATUS_NOT_PERMITTED, r.status.load());
}

TEST_F(HostDriver, ArcpoolCallsFromInsideHostWorkAreRefused) {
  arcpool_allocator_options_t options;
  arcpool_allocator_options_init(&options);
  options.driver = ARCPOOL_DRIVER_HOST;
  arcpool_allocator_t* alloc = nullptr;
  ASSERT_OK(arcpool_allocator_create(&options, &alloc));
  struct call {
    arcpool_allocator_t* alloc;
    arcpool_stream_t s;
    std::atomic<int> status{-1};
  } c{alloc, a_};
  ASSERT_OK(drv_->launch_host_func(
      a_,
      [](void* p) {
        auto* cl = static_cast<call*>(p);
        arcpool_allocation_t* out = nullptr;
        cl->status = arcpool_allocate_async(cl->alloc, 64, 0, cl->s, 0, &out);
      },
      &c));
  ASSERT_OK(drv_->stream_synchronize(a_));
  EXPECT_EQ(ARCPOOL_STATUS_NOT_PERMITTED, c.status.load());
  arcpool_allocator_destroy(alloc);
}

TEST_F(HostDriver, DestroyingAStreamStillRunsItsQueuedWork) {
  arcpool_stream_t doomed = nullptr;
  ASSERT_OK(drv_->stream_create(&doomed));
  auto open = hold(doomed);
  std::atomic<bool> ran{false};
  ASSERT_OK(drv_->launch_host_func(
      doomed, [](void* p) { static_cast<std::atomic<bool>*>(p)->store(true); }, &ran));
  ASSERT_OK(drv_->stream_destroy(doomed));  // returns at once
  EXPECT_FALSE(ran.load());
  EXPECT_STATUS(ARCPOOL_STATUS_INVALID_ARGUMENT, drv_->stream_synchronize(doomed))
      << "a destroyed handle is refused, not used";
  open->store(true);
  while (!ran.load())
    std::this_thread::yield();
}

// CUDA lets a destroyed stream's queued work finish, and nothing waits for it: creating a
// stream joined every destroyed stream nobody referenced, drained or not, under the stream
// table's lock, so it waited for work that may wait for the caller.
TEST_F(HostDriver, CreatingAStreamNeverWaitsForADestroyedStreamToDrain) {
  arcpool_stream_t doomed = nullptr;
  ASSERT_OK(drv_->stream_create(&doomed));
  auto open = hold(doomed);
  ASSERT_OK(drv_->stream_destroy(doomed));
  std::atomic<bool> created{false};
  std::thread creator([&] {
    arcpool_stream_t s = nullptr;
    EXPECT_OK(drv_->stream_create(&s));
    created = true;
    EXPECT_OK(drv_->stream_destroy(s));
  });
  // Long enough for a loaded machine under a sanitizer; a passing run ends at the creation.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!created.load() && std::chrono::steady_clock::now() < until)
    std::this_thread::yield();
  EXPECT_TRUE(created.load()) << "stream_create waited for a destroyed stream's work";
  open->store(true);
  creator.join();
}

TEST_F(HostDriver, PerThreadDefaultStreamsAreDistinctPerThread) {
  const auto per_thread = reinterpret_cast<arcpool_stream_t>(0x2);
  uint64_t here = 0;
  uint64_t there = 0;
  ASSERT_OK(drv_->stream_id(per_thread, &here));
  std::thread([&] { EXPECT_OK(drv_->stream_id(per_thread, &there)); }).join();
  EXPECT_NE(here, there);
  uint64_t again = 0;
  ASSERT_OK(drv_->stream_id(per_thread, &again));
  EXPECT_EQ(here, again);
  uint64_t legacy = 0;
  uint64_t legacy_alias = 0;
  ASSERT_OK(drv_->stream_id(nullptr, &legacy));
  ASSERT_OK(drv_->stream_id(reinterpret_cast<arcpool_stream_t>(0x1), &legacy_alias));
  EXPECT_EQ(legacy, legacy_alias);
}

TEST_F(HostDriver, DeviceSynchronizeWaitsForEveryThreadsPerThreadStream) {
  const auto per_thread = reinterpret_cast<arcpool_stream_t>(0x2);
  std::shared_ptr<std::atomic<bool>> open;
  std::atomic<bool> ran{false};
  std::thread([&] {
    open = hold(per_thread);  // this thread's own per-thread stream; the thread then exits
    EXPECT_OK(drv_->launch_host_func(
        per_thread, [](void* p) { static_cast<std::atomic<bool>*>(p)->store(true); }, &ran));
  }).join();
  open->store(true);
  ASSERT_OK(drv_->device_synchronize());
  EXPECT_TRUE(ran.load()) << "device_synchronize returned before another thread's stream ran";
}

TEST_F(HostDriver, CaptureIsSimulatedAndRefusesWork) {
  ASSERT_OK(drv_->stream_begin_capture(a_));
  bool capturing = false;
  ASSERT_OK(drv_->stream_is_capturing(a_, &capturing));
  EXPECT_TRUE(capturing);
  EXPECT_STATUS(ARCPOOL_STATUS_UNSUPPORTED, drv_->event_record(e_, a_));
  ASSERT_OK(drv_->stream_end_capture(a_));
  ASSERT_OK(drv_->event_record(e_, a_));
}

/// The null driver's fake addresses are unique in the process: each thread bumps a region of
/// its own, and two allocators' regions must not overlap (the by-pointer map is the process's,
/// and an entry of one allocator replaced the other's). Each allocator numbered its regions
/// from the same first address, while a thread's region outlived the allocator it came from.
TEST(NullDriver, TwoAllocatorsOnFreshThreadsNeverHandOutTheSameAddress) {
  arcpool_allocator_t* allocators[2] = {nullptr, nullptr};
  void* pointers[2] = {nullptr, nullptr};
  for (int i = 0; i < 2; ++i) {
    arcpool_allocator_options_t options;
    arcpool_allocator_options_init(&options);
    options.driver = ARCPOOL_DRIVER_NULL;
    ASSERT_OK(arcpool_allocator_create(&options, &allocators[i]));
    std::thread([&] {
      EXPECT_OK(arcpool_allocator_malloc_async(allocators[i], 256, 0, nullptr, &pointers[i]));
    }).join();
  }
  EXPECT_NE(pointers[0], pointers[1]) << "two allocations at one address";
  for (int i = 0; i < 2; ++i) {
    EXPECT_OK(arcpool_allocator_free_async(allocators[i], pointers[i], nullptr));
    arcpool_stats_t st;
    st.struct_size = sizeof(st);
    st.version = ARCPOOL_STATS_VERSION;
    EXPECT_OK(arcpool_stats_get(allocators[i], &st));
    EXPECT_EQ(0u, st.allocations_in_use_current) << "allocator " << i << " lost its free";
    arcpool_allocator_destroy(allocators[i]);
  }
}

// The null driver lends each thread a 1 TiB region of addresses: a request past it was lent all
// the same, running into the next thread's region (and SIZE_MAX, rounded up, wrapped to 0 bytes:
// the next allocation got the same address). It is out of memory, as past a device.
TEST(NullDriver, ARequestPastItsRegionIsOutOfMemory) {
  arcpool_allocator_options_t options;
  arcpool_allocator_options_init(&options);
  options.driver = ARCPOOL_DRIVER_NULL;
  arcpool_allocator_t* alloc = nullptr;
  ASSERT_OK(arcpool_allocator_create(&options, &alloc));
  void* p = nullptr;
  EXPECT_STATUS(ARCPOOL_STATUS_OUT_OF_MEMORY,
                arcpool_allocator_malloc_async(alloc, size_t{1} << 50, 0, nullptr, &p));
  EXPECT_EQ(nullptr, p);
  EXPECT_OK(arcpool_allocator_malloc_async(alloc, 256, 0, nullptr, &p)) << "still usable";
  EXPECT_OK(arcpool_allocator_free_async(alloc, p, nullptr));
  arcpool_allocator_destroy(alloc);
}

}  // namespace
}  // namespace arcpool::test
