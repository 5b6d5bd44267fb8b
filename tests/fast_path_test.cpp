// What the fast path (a same-stream cache hit, design.md §7) must keep doing while it is made
// shorter: refuse a capturing stream, count in every statistic a slow allocation counts in, and
// hand records freed on one thread to allocations on another. On every driver, on a created
// stream and on the legacy default stream (NULL: PyTorch's and CuPy's default), which both take
// it.
#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "support/driver_test.hpp"

namespace arcpool::test {
namespace {

constexpr size_t kBlock = 4096;

class FastPath : public DriverTest {
 protected:
  void customize(arcpool_allocator_options_t& options) override {
    options.stream_cache_bytes = 1024 * kBlock;  // the default, whatever the fixture's is
    options.stream_cache_max_block = 64 * kBlock;
  }
  void SetUp() override {
    DriverTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    s_ = legacy() ? nullptr : make_stream();
  }
  /// Runs the suite on the legacy default stream instead of a created one.
  virtual bool legacy() const { return false; }

  /// Allocates a block on s_ and frees it there, so that the next allocation of its size hits.
  void warm() {
    arcpool_allocation_t* a = allocate(kBlock, s_);
    ASSERT_OK(arcpool_deallocate_async(a, s_, 0));
    arcpool_allocation_release(a);
    ASSERT_EQ(kBlock, stats().bytes_cached_current);
  }

  // The tests both suites run.

  /// A hit and its free count in every statistic an allocation and a deallocation move.
  void a_cache_hit_counts_in_every_statistic_an_allocation_moves() {
    warm();
    const arcpool_stats_t before = stats();
    arcpool_allocation_t* a = allocate(kBlock, s_);
    const arcpool_stats_t during = stats();
    EXPECT_EQ(before.cache_hits + 1, during.cache_hits);
    EXPECT_EQ(before.allocations + 1, during.allocations);
    EXPECT_EQ(before.bytes_in_use_current + kBlock, during.bytes_in_use_current);
    EXPECT_EQ(before.allocations_in_use_current + 1, during.allocations_in_use_current);
    EXPECT_EQ(before.bytes_cached_current - kBlock, during.bytes_cached_current);
    EXPECT_EQ(before.bytes_held_current, during.bytes_held_current) << "no pool allocation";
    EXPECT_GE(during.bytes_in_use_peak, kBlock);
    ASSERT_OK(arcpool_deallocate_async(a, s_, 0));
    arcpool_allocation_release(a);
    const arcpool_stats_t after = stats();
    EXPECT_EQ(before.deallocations + 1, after.deallocations);
    EXPECT_EQ(before.same_stream_frees + 1, after.same_stream_frees);
    EXPECT_EQ(before.cache_frees + 1, after.cache_frees);
    EXPECT_EQ(before.bytes_in_use_current, after.bytes_in_use_current);
    EXPECT_EQ(before.allocations_in_use_current, after.allocations_in_use_current);
    EXPECT_EQ(before.bytes_cached_current, after.bytes_cached_current);
  }

  /// A free on the origin while another stream uses the block is not cached.
  void a_free_on_the_origin_with_another_streams_use_is_not_cached() {
    // The same-stream route, and so the cache, only without other streams' uses (design.md §4):
    // a block another stream may still read must not be lent to the origin's next allocation.
    warm();
    arcpool_stream_t reader = make_stream();
    arcpool_allocation_t* a = allocate(kBlock, s_);  // the cache's block
    ASSERT_OK(arcpool_record_use(a, reader));
    const arcpool_stats_t before = stats();
    ASSERT_OK(arcpool_deallocate_async(a, s_, 0));
    const arcpool_stats_t after = stats();
    EXPECT_EQ(before.deallocations + 1, after.deallocations);
    EXPECT_EQ(before.cache_frees, after.cache_frees)
        << "the block went into the origin's cache while another stream may use it";
    EXPECT_EQ(before.bytes_cached_current, after.bytes_cached_current);
    arcpool_allocation_release(a);
    sync(reader);
    sync(s_);
    finish_reclaims();
    EXPECT_EQ(0u, stats().allocations_in_use_current);
  }

  /// Records released on other threads serve this thread's later allocations intact.
  void records_released_on_another_thread_serve_later_allocations() {
    // Records allocated here, released on other threads (into those threads' lists, which have
    // room), then allocated and released here again: every record must stay intact and none may
    // leak (LeakSanitizer runs at exit in the ASan build; TSan watches the hand-off).
    constexpr int kRounds = 4;
    constexpr int kPerRound = 64;
    for (int round = 0; round < kRounds; ++round) {
      std::vector<arcpool_allocation_t*> made;
      for (int i = 0; i < kPerRound; ++i)
        made.push_back(allocate(kBlock + 256 * i, s_));
      std::thread other([&] {
        for (arcpool_allocation_t* a : made) {
          EXPECT_OK(arcpool_deallocate_async(a, s_, 0));
          arcpool_allocation_release(a);
        }
      });
      other.join();
      for (int i = 0; i < kPerRound; ++i) {
        arcpool_allocation_t* a = allocate(kBlock + 256 * i, s_);
        EXPECT_EQ(kBlock + 256 * i, arcpool_allocation_size(a));
        EXPECT_OK(arcpool_deallocate_async(a, s_, 0));
        arcpool_allocation_release(a);
      }
    }
    sync(s_);
    EXPECT_EQ(0u, stats().allocations_in_use_current);
  }

  /// More records than a thread's list holds, released on another thread while this one keeps
  /// allocating: the blocks past that thread's list go back to this thread's inbox while this
  /// thread takes its inbox for its own allocations (support/thread_state.hpp; TSan watches
  /// the pushes against the takes).
  void records_released_past_another_threads_list_go_back_while_this_thread_allocates() {
    constexpr int kRecords = 1024;  // four lists' worth (block_list::kCapacity)
    std::vector<arcpool_allocation_t*> made;
    for (int i = 0; i < kRecords; ++i)
      made.push_back(allocate(kBlock, s_));
    std::thread other([&] {
      for (arcpool_allocation_t* a : made) {
        EXPECT_OK(arcpool_deallocate_async(a, s_, 0));
        arcpool_allocation_release(a);
      }
    });
    // Batches larger than this thread's list, so that it runs dry and takes its inbox.
    for (int round = 0; round < 8; ++round) {
      std::vector<arcpool_allocation_t*> batch;
      for (int i = 0; i < 300; ++i)
        batch.push_back(allocate(2 * kBlock, s_));
      for (arcpool_allocation_t* a : batch) {
        EXPECT_EQ(2 * kBlock, arcpool_allocation_size(a));
        EXPECT_OK(arcpool_deallocate_async(a, s_, 0));
        arcpool_allocation_release(a);
      }
    }
    other.join();
    sync(s_);
    EXPECT_EQ(0u, stats().allocations_in_use_current);
  }

  arcpool_stream_t s_ = nullptr;
};

/// The same tests on the legacy default stream, which takes the same fast path (its cache is
/// the allocator's legacy cache, its statistics row the other-streams row).
class FastPathOnTheLegacyStream : public FastPath {
 protected:
  bool legacy() const override { return true; }
};

TEST_P(FastPath, ACacheHitOnACapturingStreamIsUnsupportedAndTakesNothing) {
  warm();
  // The stream is known to this thread's stream cache, so the lookup itself asks nothing: only
  // the fast path's own capture check can turn it away from the cache. The host drivers refuse
  // the allocation; the CUDA driver makes it a graph allocation (docs/graphs.md).
  const arcpool_stats_t before = stats();
  ASSERT_OK(core().drv().stream_begin_capture(s_));
  arcpool_allocation_t* a = nullptr;
  const bool graphs = core().drv().supports_graphs();
  if (graphs) {
    ASSERT_OK(arcpool_allocate_async(alloc_, kBlock, 0, s_, 0, &a));
    arcpool_placement_t p = placement(a);
    EXPECT_NE(0u, p.flags & ARCPOOL_PLACEMENT_FLAG_GRAPH);
    ASSERT_OK(arcpool_deallocate_async(a, s_, 0));
    arcpool_allocation_release(a);
  } else {
    EXPECT_STATUS(ARCPOOL_STATUS_UNSUPPORTED, arcpool_allocate_async(alloc_, kBlock, 0, s_, 0, &a));
    EXPECT_EQ(nullptr, a);
  }
  ASSERT_OK(core().drv().stream_end_capture(s_));
  const arcpool_stats_t after = stats();
  EXPECT_EQ(before.cache_hits, after.cache_hits);
  EXPECT_EQ(before.allocations + (graphs ? 1 : 0), after.allocations);
  EXPECT_EQ(kBlock, after.bytes_cached_current) << "the cached block stays cached";
  // Capture over: the same call hits.
  arcpool_allocation_t* hit = allocate(kBlock, s_);
  EXPECT_EQ(before.cache_hits + 1, stats().cache_hits);
  EXPECT_OK(arcpool_deallocate_async(hit, s_, 0));
  arcpool_allocation_release(hit);
}

TEST_P(FastPath, ACacheHitCountsInEveryStatisticAnAllocationMoves) {
  a_cache_hit_counts_in_every_statistic_an_allocation_moves();
}
TEST_P(FastPathOnTheLegacyStream, ACacheHitCountsInEveryStatisticAnAllocationMoves) {
  a_cache_hit_counts_in_every_statistic_an_allocation_moves();
}
TEST_P(FastPath, AFreeOnTheOriginWithAnotherStreamsUseIsNotCached) {
  a_free_on_the_origin_with_another_streams_use_is_not_cached();
}
TEST_P(FastPathOnTheLegacyStream, AFreeOnTheOriginWithAnotherStreamsUseIsNotCached) {
  a_free_on_the_origin_with_another_streams_use_is_not_cached();
}
TEST_P(FastPath, RecordsReleasedOnAnotherThreadServeLaterAllocations) {
  records_released_on_another_thread_serve_later_allocations();
}
TEST_P(FastPathOnTheLegacyStream, RecordsReleasedOnAnotherThreadServeLaterAllocations) {
  records_released_on_another_thread_serve_later_allocations();
}

TEST_P(FastPath, RecordsReleasedPastAnotherThreadsListGoBackWhileThisThreadAllocates) {
  records_released_past_another_threads_list_go_back_while_this_thread_allocates();
}
TEST_P(FastPathOnTheLegacyStream,
       RecordsReleasedPastAnotherThreadsListGoBackWhileThisThreadAllocates) {
  records_released_past_another_threads_list_go_back_while_this_thread_allocates();
}

TEST_P(FastPathOnTheLegacyStream, AFreeThereOfAnotherStreamsMemoryIsNotCachedThere) {
  // Memory of a created stream handed to the legacy default stream and freed there is freed
  // across streams (design.md §4): neither the legacy stream's cache nor its statistics row
  // takes it, and its origin's row sees it go.
  arcpool_stream_t origin = make_stream();
  arcpool_allocation_t* a = allocate(kBlock, origin);
  ASSERT_OK(arcpool_transfer(a, s_));
  const arcpool_stats_t before = stats();
  ASSERT_OK(arcpool_deallocate_async(a, s_, 0));
  const arcpool_stats_t after = stats();
  EXPECT_EQ(before.deallocations + 1, after.deallocations);
  EXPECT_EQ(before.cross_stream_frees + 1, after.cross_stream_frees);
  EXPECT_EQ(before.same_stream_frees, after.same_stream_frees)
      << "a free on the legacy stream of another stream's memory took the same-stream route";
  arcpool_allocation_release(a);
  sync(s_);
  sync(origin);
  finish_reclaims();
  EXPECT_EQ(0u, stats().allocations_in_use_current);
  const arcpool_stream_stats_t row = stream_stats_row(origin);
  EXPECT_EQ(0u, row.bytes_in_use_current) << "the origin's row never saw its memory go";
  EXPECT_EQ(1u, row.cross_stream_frees);
}

ARCPOOL_INSTANTIATE_FOR_DRIVERS(FastPath);
ARCPOOL_INSTANTIATE_FOR_DRIVERS(FastPathOnTheLegacyStream);

}  // namespace
}  // namespace arcpool::test
