// The fast path (design.md §7): a bounded per-stream cache of freed blocks, reused only on the
// same stream, exact sizes, flushed on trim, pressure and retirement. On both drivers.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <thread>
#include <vector>

#include "support/driver_test.hpp"
#include "support/simcuda_probe.hpp"

namespace arcpool::test {
namespace {

constexpr size_t kBlock = 4096;

class StreamCache : public DriverTest {
 protected:
  void customize(arcpool_allocator_options_t& options) override {
    options.stream_cache_bytes = 16 * kBlock;
    options.stream_cache_max_block = 64 * kBlock;
    options.before_free = [](void*, size_t, arcpool_stream_t, void* user_data) {
      static_cast<std::atomic<int>*>(user_data)->fetch_add(1);
    };
    options.before_free_user_data = &before_free_calls_;
  }
  void SetUp() override {
    DriverTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    s_ = make_stream();
    t_ = make_stream();
  }

  /// Allocates `bytes` on `s` and frees it there at once (into the cache if it fits).
  void* allocate_and_free(size_t bytes, arcpool_stream_t s, uint32_t flags = 0) {
    arcpool_allocation_t* a = allocate(bytes, s);
    void* p = data(a);
    EXPECT_OK(arcpool_deallocate_async(a, s, flags));
    arcpool_allocation_release(a);
    return p;
  }

  std::atomic<int> before_free_calls_{0};
  arcpool_stream_t s_ = nullptr;
  arcpool_stream_t t_ = nullptr;
};

/// A cached block whose free fails at a flush (here a stream's destruction) is written off and
/// counted in reclaim_failures, as a deferred free's failed CUDA call is (design.md §10); it was
/// neither counted nor reported.
TEST_P(StreamCache, ACachedBlockWhoseFreeFailsAtAFlushIsCountedAsAReclaimFailure) {
  if (GetParam().kind != ARCPOOL_DRIVER_CUDA || !on_simcuda()) {
    GTEST_SKIP() << "fails the flush's free with simcuda_fail_next";
  }
  arcpool_stream_t s = nullptr;  // not the fixture's: destroyed here
  ASSERT_OK(arcpool_stream_create(alloc_, &s));
  allocate_and_free(kBlock, s);
  ASSERT_EQ(1u, stats().cache_frees);
  ASSERT_TRUE(simcuda_fail_next("cudaFreeAsync", cudaErrorInvalidValue));
  EXPECT_OK(arcpool_stream_destroy(alloc_, s));
  const arcpool_stats_t st = stats();
  EXPECT_EQ(1u, st.cache_flushes);
  EXPECT_EQ(0u, st.frees);
  EXPECT_EQ(1u, st.reclaim_failures) << "a failed free at a flush went uncounted";
  EXPECT_EQ(0u, st.bytes_cached_current);
}

/// A deallocation whose free fails after its commit (a broken context) loses the block: counted
/// in reclaim_failures, as at a flush. It was counted nowhere (neither a free nor a failure).
TEST_P(StreamCache, ADeallocationsFreeThatFailsAfterTheCommitIsCountedAsAReclaimFailure) {
  if (GetParam().kind != ARCPOOL_DRIVER_CUDA || !on_simcuda()) {
    GTEST_SKIP() << "fails the deallocation's free with simcuda_fail_next";
  }
  constexpr size_t kUncached = size_t{2} << 20;  // above the cache's largest block
  arcpool_allocation_t* a = allocate(kUncached, s_);
  ASSERT_TRUE(simcuda_fail_next("cudaFreeAsync", cudaErrorInvalidValue));
  EXPECT_STATUS(ARCPOOL_STATUS_CUDA_ERROR, arcpool_deallocate_async(a, s_, 0));
  arcpool_allocation_release(a);
  const arcpool_stats_t st = stats();
  EXPECT_EQ(0u, st.frees);
  EXPECT_EQ(1u, st.reclaim_failures) << "a failed free after the commit went uncounted";
  EXPECT_EQ(0u, st.bytes_held_current);
}

/// The same failure at a leaked allocation's implicit free (its last reference released without
/// a deallocation) is counted once: counted where the free failed, it was counted again by the
/// last reference.
TEST_P(StreamCache, ALeakedAllocationsFreeThatFailsAfterTheCommitIsCountedOnce) {
  if (GetParam().kind != ARCPOOL_DRIVER_CUDA || !on_simcuda()) {
    GTEST_SKIP() << "fails the implicit free with simcuda_fail_next";
  }
  constexpr size_t kUncached = size_t{2} << 20;  // above the cache's largest block
  arcpool_allocation_t* a = allocate(kUncached, s_);
  ASSERT_TRUE(simcuda_fail_next("cudaFreeAsync", cudaErrorInvalidValue));
  arcpool_allocation_release(a);  // leaked: the last reference frees it
  const arcpool_stats_t st = stats();
  EXPECT_EQ(1u, st.implicit_frees) << "committed, then its free failed";
  EXPECT_EQ(0u, st.frees);
  EXPECT_EQ(1u, st.reclaim_failures) << "one failure, counted twice";
  EXPECT_EQ(0u, st.bytes_held_current);
  EXPECT_EQ(0u, st.allocations_in_use_current);
}

TEST_P(StreamCache, ATrimWaitingForABusyStreamHoldsUpNoStreamCreationOrRetirement) {
  ARCPOOL_SKIP_ON_DETERMINISTIC("the trim waits on a thread of its own");
  // A trim (and an out-of-memory retry) waits for arcpool's streams; creating, registering,
  // unregistering and destroying streams "never blocks" (arcpool.h). The trim waited holding
  // the registry's lock and the busy stream's, which those calls need: each then waited for
  // the busy stream's work (a deadlock, were that work waiting for the caller). Twice: the
  // trim first waits for its flush of s_'s cache, then (the cache empty) for s_ itself.
  for (const bool cached : {true, false}) {
    SCOPED_TRACE(cached ? "waiting for its cache flush" : "waiting for the stream");
    if (cached) {
      allocate_and_free(kBlock, s_);
      ASSERT_NE(0u, stats().bytes_cached_current);
    }
    gate& busy = block(s_);
    arcpool_stream_t registered = make_app_stream();
    ASSERT_OK(arcpool_stream_register(alloc_, registered));
    // The trim has reached s_ (its flush's free, or its fence) once the driver saw work queued
    // there; it then waits (on a GPU, where nothing counts it: after 100 ms).
    const uint64_t work_before = can_count_work() ? work_enqueued(s_) : 0;
    const uint64_t records_before = simcuda_calls("cudaEventRecord");
    auto fenced = [&] {
      if (can_count_work()) return work_enqueued(s_) > work_before;
      return !on_simcuda() || simcuda_calls("cudaEventRecord") > records_before;
    };
    std::atomic<bool> trimmed{false};
    std::thread trimmer([&] {
      EXPECT_OK(arcpool_allocator_trim(alloc_, 0));
      trimmed = true;
    });
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!fenced() && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    EXPECT_TRUE(fenced()) << "the trim never reached the busy stream";
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    arcpool_stream_t created = nullptr;
    auto create =
        std::async(std::launch::async, [&] { return arcpool_stream_create(alloc_, &created); });
    auto unregister = std::async(std::launch::async,
                                 [&] { return arcpool_stream_unregister(alloc_, registered); });
    const auto patience = std::chrono::seconds(5);  // spent only when the calls wait
    EXPECT_EQ(std::future_status::ready, create.wait_for(patience))
        << "a stream's creation waited for the trim";
    EXPECT_EQ(std::future_status::ready, unregister.wait_for(patience))
        << "a stream's unregistration waited for the trim";
    EXPECT_FALSE(trimmed.load()) << "the trim did not wait for the busy stream: proves nothing";
    busy.open();
    trimmer.join();
    EXPECT_OK(create.get());
    EXPECT_OK(unregister.get());
    if (created != nullptr) {
      EXPECT_OK(arcpool_stream_destroy(alloc_, created));
    }
  }
}

TEST_P(StreamCache, ByPointerFreesRacingReuseOfTheSameAddressLoseNoRecord) {
  // A by-pointer free hands its block to the cache; another thread's by-pointer allocation on
  // the same stream gets the same address at once. Every record must still be released.
  ARCPOOL_SKIP_ON_DETERMINISTIC("the race needs threads, and the driver runs on one");
  constexpr int kThreads = 4;
  constexpr int kRounds = 2000;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kRounds; ++i) {
        void* p = nullptr;
        if (arcpool_allocator_malloc_async(alloc_, kBlock, 0, s_, &p) != ARCPOOL_STATUS_SUCCESS ||
            arcpool_allocator_free_async(alloc_, p, s_) != ARCPOOL_STATUS_SUCCESS) {
          failures.fetch_add(1);
        }
      }
    });
  }
  for (std::thread& t : threads)
    t.join();
  EXPECT_EQ(0, failures.load());
  sync(s_);
  EXPECT_EQ(0u, stats().allocations_in_use_current);
  EXPECT_TRUE(core().quiescent()) << "an allocation record outlived its free";
}

TEST_P(StreamCache, ASameStreamAllocationReusesTheFreedBlock) {
  void* first = allocate_and_free(kBlock, s_);
  arcpool_allocation_t* again = allocate(kBlock, s_);
  EXPECT_EQ(first, data(again));
  const auto st = stats();
  EXPECT_EQ(1u, st.cache_frees);
  EXPECT_EQ(1u, st.cache_hits);
  EXPECT_EQ(0u, st.frees) << "nothing went back to the pool";
  EXPECT_EQ(kBlock, st.bytes_held_current);
  EXPECT_EQ(1, before_free_calls_.load()) << "the poison hook runs for cached frees too";
  EXPECT_OK(arcpool_deallocate_async(again, s_, 0));
  arcpool_allocation_release(again);
}

TEST_P(StreamCache, AnotherStreamNeverReusesAStreamsBlock) {
  void* first = allocate_and_free(kBlock, s_);
  arcpool_allocation_t* other = allocate(kBlock, t_);
  EXPECT_NE(first, data(other));
  EXPECT_EQ(0u, stats().cache_hits);
  EXPECT_OK(arcpool_deallocate_async(other, t_, 0));
  arcpool_allocation_release(other);
}

TEST_P(StreamCache, OnlyExactSizesAreReused) {
  allocate_and_free(kBlock, s_);
  arcpool_allocation_t* smaller = allocate(kBlock - 256, s_);
  EXPECT_EQ(0u, stats().cache_hits) << "rounding would inflate memory";
  EXPECT_EQ(kBlock, stats().bytes_cached_current);
  EXPECT_OK(arcpool_deallocate_async(smaller, s_, 0));
  arcpool_allocation_release(smaller);
}

TEST_P(StreamCache, TheCacheIsBoundedInBytesAndBySize) {
  std::vector<arcpool_allocation_t*> live;
  for (int i = 0; i < 32; ++i)
    live.push_back(allocate(kBlock, s_));
  for (auto* a : live) {
    EXPECT_OK(arcpool_deallocate_async(a, s_, 0));
    arcpool_allocation_release(a);
  }
  allocate_and_free(128 * kBlock, s_);  // above stream_cache_max_block
  sync(s_);
  const auto st = stats();
  EXPECT_EQ(16u, st.cache_frees);
  EXPECT_EQ(17u, st.frees);
  EXPECT_EQ(16 * kBlock, st.bytes_cached_current);
}

TEST_P(StreamCache, TrimReleasesTheMemoryOfFreesItHasNotSeenComplete) {
  // cudaMemPoolTrimTo: frees whose completion the host has not observed can count as
  // outstanding. trim must observe the frees it enqueued (the cache's) and those already
  // queued on arcpool's streams before it trims.
  allocate_and_free(kBlock, s_);        // cached; trim flushes it on s_
  allocate_and_free(128 * kBlock, t_);  // above the cache's largest block: freed on t_ now
  ASSERT_OK(arcpool_allocator_trim(alloc_, 0));
  EXPECT_EQ(0u, stats().pool_reserved_bytes_current) << "nothing is in use: all is released";
}

TEST_P(StreamCache, TrimGivesCachedBlocksBack) {
  allocate_and_free(kBlock, s_);
  allocate_and_free(2 * kBlock, s_);
  EXPECT_EQ(3 * kBlock, stats().bytes_cached_current);
  ASSERT_OK(arcpool_allocator_trim(alloc_, 0));
  sync(s_);
  const auto st = stats();
  EXPECT_EQ(0u, st.bytes_cached_current);
  EXPECT_EQ(0u, st.bytes_held_current);
  EXPECT_EQ(2u, st.cache_flushes);
  if (on_host()) {
    EXPECT_EQ(0u, pool_used());
  }
}

TEST_P(StreamCache, UnregisteringAStreamFlushesItsCacheFirst) {
  arcpool_stream_t app = make_app_stream();
  ASSERT_OK(arcpool_stream_register(alloc_, app));
  allocate_and_free(kBlock, app);
  EXPECT_EQ(kBlock, stats().bytes_cached_current);
  ASSERT_OK(arcpool_stream_unregister(alloc_, app));
  sync(app);
  EXPECT_EQ(0u, stats().bytes_cached_current);
  EXPECT_EQ(1u, stats().cache_flushes);
  // No longer provably alive: nothing is cached on it any more.
  allocate_and_free(kBlock, app);
  sync(app);
  EXPECT_EQ(0u, stats().bytes_cached_current);
}

TEST_P(StreamCache, DestroyingAStreamFlushesItsCache) {
  arcpool_stream_t doomed = nullptr;
  ASSERT_OK(arcpool_stream_create(alloc_, &doomed));
  allocate_and_free(kBlock, doomed);
  ASSERT_OK(arcpool_stream_destroy(alloc_, doomed));
  EXPECT_EQ(0u, stats().bytes_cached_current);
  EXPECT_EQ(1u, stats().cache_flushes);
}

/// design.md §6: unregistering or destroying a capturing stream is UNSUPPORTED and changes
/// nothing: flushing its cache first would free into the capture.
TEST_P(StreamCache, RetiringACapturingStreamIsUnsupportedAndKeepsItsCache) {
  arcpool_stream_t app = make_app_stream();
  ASSERT_OK(arcpool_stream_register(alloc_, app));
  arcpool_stream_t created = nullptr;
  ASSERT_OK(arcpool_stream_create(alloc_, &created));
  allocate_and_free(kBlock, app);
  allocate_and_free(kBlock, created);
  const arcpool_stats_t before = stats();
  EXPECT_EQ(2 * kBlock, before.bytes_cached_current);
  ASSERT_OK(core().drv().stream_begin_capture(app));
  ASSERT_OK(core().drv().stream_begin_capture(created));
  EXPECT_STATUS(ARCPOOL_STATUS_UNSUPPORTED, arcpool_stream_unregister(alloc_, app));
  EXPECT_STATUS(ARCPOOL_STATUS_UNSUPPORTED, arcpool_stream_destroy(alloc_, created));
  const arcpool_stats_t during = stats();
  EXPECT_EQ(before.bytes_cached_current, during.bytes_cached_current);
  EXPECT_EQ(before.bytes_held_current, during.bytes_held_current);
  EXPECT_EQ(before.cache_flushes, during.cache_flushes);
  EXPECT_EQ(before.frees, during.frees);
  ASSERT_OK(core().drv().stream_end_capture(app));
  ASSERT_OK(core().drv().stream_end_capture(created));
  // Still registered and created: both retire normally now, giving their blocks back.
  ASSERT_OK(arcpool_stream_unregister(alloc_, app));
  ASSERT_OK(arcpool_stream_destroy(alloc_, created));
  sync(app);
  const arcpool_stats_t after = stats();
  EXPECT_EQ(0u, after.bytes_cached_current);
  EXPECT_EQ(2u, after.cache_flushes);
  EXPECT_EQ(before.frees + 2, after.frees);
  EXPECT_EQ(0u, after.bytes_held_current);
}

TEST_P(StreamCache, UnregisteredStreamsAreNotCached) {
  arcpool_stream_t app = make_app_stream();
  allocate_and_free(kBlock, app);
  sync(app);
  EXPECT_EQ(0u, stats().cache_frees) << "its blocks could not be flushed once it is gone";
  EXPECT_EQ(1u, stats().frees);
}

TEST_P(StreamCache, TheLegacyDefaultStreamIsCached) {
  void* first = allocate_and_free(kBlock, nullptr);
  arcpool_allocation_t* again = allocate(kBlock, nullptr);
  EXPECT_EQ(first, data(again));
  EXPECT_OK(arcpool_deallocate_async(again, nullptr, 0));
  arcpool_allocation_release(again);
  ASSERT_OK(arcpool_allocator_trim(alloc_, 0));
  sync(nullptr);
}

TEST_P(StreamCache, ARoutedFreeIsCachedOnlyAfterItsWaits) {
  // The block is freed on t_ after t_ waits for s_, which still writes it; the next allocation
  // on t_ reuses it at once and writes it too: t_'s write must land after s_'s.
  arcpool_allocation_t* a = allocate(kBlock, s_);
  void* first = data(a);
  gate& busy = block(s_);
  fill_async(s_, first, kBlock, 0x11);
  EXPECT_OK(arcpool_deallocate_async(a, t_, ARCPOOL_DEALLOCATE_FLAG_WAIT_AND_FREE));
  arcpool_allocation_t* b = allocate(kBlock, t_);
  EXPECT_EQ(first, data(b)) << "the wait-and-free target's cache kept the block";
  fill_async(t_, data(b), kBlock, 0x22);
  auto receiver = mark(t_);
  settle(t_);
  EXPECT_FALSE(receiver->reached()) << "t_ reused the block before its wait on s_";
  busy.open();
  sync(s_);
  sync(t_);
  EXPECT_TRUE(receiver->reached());
  expect_filled(data(b), kBlock, 0x22);
  EXPECT_OK(arcpool_deallocate_async(b, t_, 0));
  arcpool_allocation_release(a);
  arcpool_allocation_release(b);
}

// A routed free counts its route whether the block goes back to the pool or into the target
// stream's cache: a prefer-origin free kept by the origin's cache is origin-routed, and a
// fallback (an unregistered origin) kept by the caller's cache is a fallback. The cached ones
// were counted as neither.
TEST_P(StreamCache, ARoutedFreeIntoACacheCountsItsRoute) {
  arcpool_allocation_t* a = allocate(kBlock, s_);
  EXPECT_OK(arcpool_deallocate_async(a, t_, ARCPOOL_DEALLOCATE_FLAG_PREFER_ORIGIN));
  arcpool_allocation_release(a);
  arcpool_stream_t app = make_app_stream();  // unregistered: arcpool may not enqueue on it
  arcpool_allocation_t* b = allocate(kBlock, app);
  sync(app);
  EXPECT_OK(arcpool_deallocate_async(b, t_, ARCPOOL_DEALLOCATE_FLAG_PREFER_ORIGIN));
  arcpool_allocation_release(b);
  sync(s_);
  sync(t_);
  const arcpool_stats_t st = stats();
  EXPECT_EQ(2u, st.cache_frees) << "both blocks were to be cached: the test proves nothing";
  EXPECT_EQ(1u, st.origin_routed_frees);
  EXPECT_EQ(1u, st.origin_fallbacks);
}

TEST_P(StreamCache, DeferredFreesNeverEnterACache) {
  arcpool_allocation_t* a = allocate(kBlock, s_);
  EXPECT_OK(arcpool_deallocate_async(a, t_, ARCPOOL_DEALLOCATE_FLAG_DEFERRED));
  arcpool_allocation_release(a);
  sync(t_);
  finish_reclaims();
  EXPECT_EQ(0u, stats().cache_frees);
  EXPECT_EQ(1u, stats().frees);
}

ARCPOOL_INSTANTIATE_FOR_ALL_DRIVERS(StreamCache);

/// Out of memory flushes the caches before failing.
class StreamCacheUnderPressure : public StreamCache {
 protected:
  void customize(arcpool_allocator_options_t& options) override {
    StreamCache::customize(options);
    options.hard_limit_bytes = 12 * kBlock;
  }
};

TEST_P(StreamCacheUnderPressure, OutOfMemoryFlushesTheCachesAndRetries) {
  std::vector<arcpool_allocation_t*> live;
  for (int i = 0; i < 8; ++i)
    live.push_back(allocate(kBlock, s_));
  for (auto* a : live) {
    EXPECT_OK(arcpool_deallocate_async(a, s_, 0));
    arcpool_allocation_release(a);
  }
  EXPECT_EQ(8 * kBlock, stats().bytes_cached_current);
  arcpool_allocation_t* big = nullptr;
  ASSERT_OK(arcpool_allocate_async(alloc_, 8 * kBlock, 0, t_, 0, &big));
  EXPECT_EQ(1u, stats().oom_retries);
  EXPECT_EQ(0u, stats().bytes_cached_current);
  EXPECT_OK(arcpool_deallocate_async(big, t_, 0));
  arcpool_allocation_release(big);
}

ARCPOOL_INSTANTIATE_FOR_ALL_DRIVERS(StreamCacheUnderPressure);

}  // namespace
}  // namespace arcpool::test
