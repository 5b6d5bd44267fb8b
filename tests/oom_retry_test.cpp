// design.md §7: on allocation failure arcpool flushes the caches and completes pending reclaims,
// and the retry waits for those frees (and the frees already queued on its streams) to have run:
// an owned pool lends a block freed on another stream only once that free ran (issue 9).
//
// On the deterministic driver with a 4 MiB pool nothing runs unless driven, so a retry that did
// not wait would find the pool still full: a certain false out-of-memory, never a lucky timing.
#include <gtest/gtest.h>

#include "support/driver_test.hpp"

namespace arcpool::test {
namespace {

constexpr size_t kPool = size_t{4} << 20;
constexpr size_t kBig = size_t{3} << 20;  // two never fit

class OutOfMemoryRetry : public DriverTest {
 protected:
  void customize(arcpool_allocator_options_t& options) override {
    options.host_capacity_bytes = kPool;
    options.max_pool_bytes = kPool;
    options.stream_cache_bytes = 2 * kPool;  // the fast path on, for blocks up to the pool
    options.stream_cache_max_block = kPool;
  }
  void SetUp() override {
    DriverTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    x_ = make_stream();
    y_ = make_stream();
  }

  /// Allocates kBig on `s` (the pool then cannot lend another kBig).
  arcpool_allocation_t* fill_the_pool(arcpool_stream_t s, size_t alignment = 0) {
    arcpool_allocation_t* a = nullptr;
    EXPECT_OK(arcpool_allocate_async(alloc_, kBig, alignment, s, 0, &a));
    return a;
  }

  /// Allocates kBig on y_, which only the retry can serve; expects success.
  void allocate_through_the_retry() {
    arcpool_allocation_t* b = nullptr;
    EXPECT_OK(arcpool_allocate_async(alloc_, kBig, 0, y_, 0, &b)) << "a false out-of-memory";
    const arcpool_stats_t st = stats();
    EXPECT_EQ(1u, st.oom_retries) << "the first try must fail: the test would prove nothing";
    EXPECT_EQ(0u, st.oom_failures);
    if (b != nullptr) {
      EXPECT_OK(arcpool_deallocate_async(b, y_, 0));
      arcpool_allocation_release(b);
    }
  }

  /// Fills the pool from a stream arcpool does not know and frees it, deferred, on y_: a
  /// polling pass queues the free on the reclaim stream (there is no other stream to route it
  /// to), where it has not run yet, so that the pool is still full.
  void queue_a_free_on_the_reclaim_stream() {
    arcpool_stream_t app = make_app_stream();
    arcpool_allocation_t* a = fill_the_pool(app);
    EXPECT_OK(arcpool_deallocate_async(a, y_, ARCPOOL_DEALLOCATE_FLAG_DEFERRED));
    arcpool_allocation_release(a);
    sync(app);
    sync(y_);
    ASSERT_EQ(1u, core().reclaim_poll_once()) << "the free is queued on the reclaim stream";
    ASSERT_EQ(kBig, pool_used()) << "not run yet: nothing runs unless driven";
  }

  arcpool_stream_t x_ = nullptr;
  arcpool_stream_t y_ = nullptr;
};

TEST_P(OutOfMemoryRetry, TheRetryWaitsForTheFlushedCacheFreesToRun) {
  arcpool_allocation_t* a = fill_the_pool(x_);
  EXPECT_OK(arcpool_deallocate_async(a, x_, 0));  // x_'s cache keeps the block
  arcpool_allocation_release(a);
  EXPECT_EQ(1u, stats().cache_frees);
  EXPECT_EQ(kBig, pool_used()) << "the pool still lends the cached block to x_ only";
  allocate_through_the_retry();
  EXPECT_EQ(1u, stats().cache_flushes);
}

TEST_P(OutOfMemoryRetry, TheRetryWaitsForThePendingReclaimsToRun) {
  arcpool_allocation_t* a = fill_the_pool(x_);
  EXPECT_OK(arcpool_deallocate_async(a, y_, ARCPOOL_DEALLOCATE_FLAG_DEFERRED));
  arcpool_allocation_release(a);
  EXPECT_EQ(1u, core().reclaim_pending()) << "no worker: it waits for a poll, a drain or a trim";
  allocate_through_the_retry();
  EXPECT_EQ(0u, core().reclaim_pending());
  EXPECT_EQ(1u, stats().deferred_frees);
}

TEST_P(OutOfMemoryRetry, TheRetryWaitsForFreesQueuedOnArcpoolsOtherStreams) {
  // Over-aligned: the cache does not take it, so the free is a pool free queued on x_.
  arcpool_allocation_t* a = fill_the_pool(x_, 1024);
  EXPECT_OK(arcpool_deallocate_async(a, x_, 0));
  arcpool_allocation_release(a);
  EXPECT_EQ(0u, stats().cache_frees);
  EXPECT_EQ(1u, stats().frees) << "queued on x_, not run: nothing runs unless driven";
  allocate_through_the_retry();
}

TEST_P(OutOfMemoryRetry, TheRetryWaitsForFreesTheWorkerQueuedOnTheReclaimStream) {
  // The origin is a stream arcpool does not know: the deferred free goes to the reclaim
  // stream, queued there by a pass that ran before the retry (the worker's, here this
  // thread's) and not run yet. The retry's drain finds no item left, and must still wait for
  // that stream.
  ASSERT_NO_FATAL_FAILURE(queue_a_free_on_the_reclaim_stream());
  allocate_through_the_retry();
}

TEST_P(OutOfMemoryRetry, ItsDrainWaitsForFreesAnEarlierPassQueuedOnTheReclaimStream) {
  // The drain the retry relies on, alone: it finds no item left, and must still wait for the
  // free an earlier pass queued on the reclaim stream. Nothing else here runs work (the retry
  // above also synchronizes arcpool's streams, whose waits may run that free by the seed's
  // choice), so a drain that does not wait is caught at every seed.
  ASSERT_NO_FATAL_FAILURE(queue_a_free_on_the_reclaim_stream());
  EXPECT_OK(core().reclaim_drain());
  EXPECT_EQ(0u, pool_used()) << "the drain returned before the reclaim stream's free ran";
}

// The deterministic driver only: on a threaded driver the frees run by themselves, so a retry
// that does not wait passes by luck.
INSTANTIATE_TEST_SUITE_P(Drivers, OutOfMemoryRetry, ::testing::Values(deterministic_driver()),
                         [](const ::testing::TestParamInfo<driver_param>& i) {
                           return i.param.name();
                         });

}  // namespace
}  // namespace arcpool::test
