// Statistics per stream (design.md §11, issue 12): an allocation counts on its origin stream's
// row, streams without a row of their own share the other-streams row, and the rows add up to
// the allocator's totals. On every driver.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "support/driver_test.hpp"

namespace arcpool::test {
namespace {

constexpr size_t kSmall = 4096;  // cached on the fast path
constexpr size_t kBig = size_t{1} << 20;

class StreamStats : public DriverTest {
 protected:
  void customize(arcpool_allocator_options_t& options) override {
    options.stream_cache_bytes = size_t{4} << 20;
    options.stream_cache_max_block = size_t{1} << 20;
  }

  void free_on(arcpool_allocation_t* a, arcpool_stream_t s, uint32_t flags = 0) {
    EXPECT_OK(arcpool_deallocate_async(a, s, flags));
    arcpool_allocation_release(a);
  }
};

TEST_P(StreamStats, AnAllocationCountsOnItsOriginStreamUntilItIsFreed) {
  arcpool_stream_t origin = make_stream();
  arcpool_stream_t user = make_stream();
  arcpool_allocation_t* a = allocate(kBig, origin);
  ASSERT_OK(arcpool_transfer(a, user));
  arcpool_stream_stats_t o = stream_stats_row(origin);
  EXPECT_EQ(kBig, o.bytes_in_use_current);
  EXPECT_EQ(1u, o.allocations);
  EXPECT_EQ(0u, stream_stats_row(user).bytes_in_use_current) << "a transfer moves no bytes";
  free_on(a, user, ARCPOOL_DEALLOCATE_FLAG_DEFERRED);
  sync(origin);
  sync(user);
  finish_reclaims();
  o = stream_stats_row(origin);
  EXPECT_EQ(0u, o.bytes_in_use_current);
  EXPECT_EQ(kBig, o.bytes_in_use_peak);
  EXPECT_EQ(1u, o.cross_stream_frees);
  EXPECT_EQ(1u, o.deferred_frees);
  const arcpool_stream_stats_t u = stream_stats_row(user);
  EXPECT_EQ(0u, u.allocations + u.cross_stream_frees + u.deferred_frees + u.bytes_in_use_peak);
  EXPECT_OK(arcpool_stats_reset_peaks(alloc_));
  EXPECT_EQ(0u, stream_stats_row(origin).bytes_in_use_peak);
}

TEST_P(StreamStats, ACacheHitCountsOnItsStream) {
  arcpool_stream_t s = make_stream();
  for (int i = 0; i < 3; ++i)
    free_on(allocate(kSmall, s), s);
  const arcpool_stream_stats_t r = stream_stats_row(s);
  EXPECT_EQ(3u, r.allocations);
  EXPECT_EQ(2u, r.cache_hits);
  EXPECT_EQ(0u, r.cross_stream_frees);
}

TEST_P(StreamStats, AFreeIntoItsStreamsCacheTakesItsBytesOffTheRow) {
  // The first free fills the cache, the second allocation hits it: both frees are the fast
  // path's (design.md §7).
  arcpool_stream_t s = make_stream();
  for (int i = 0; i < 2; ++i) {
    arcpool_allocation_t* a = allocate(kSmall, s);
    EXPECT_EQ(kSmall, stream_stats_row(s).bytes_in_use_current);
    free_on(a, s);
    EXPECT_EQ(0u, stream_stats_row(s).bytes_in_use_current) << "round " << i;
  }
  EXPECT_EQ(1u, stream_stats_row(s).cache_hits);
}

TEST_P(StreamStats, TheRowsAddUpToTheAllocatorsTotals) {
  arcpool_stream_t a = make_stream();
  arcpool_stream_t b = make_stream();
  arcpool_stream_t registered = make_app_stream();
  ASSERT_OK(arcpool_stream_register(alloc_, registered));
  arcpool_stream_t unknown = make_app_stream();  // counts on the other-streams row
  std::vector<arcpool_allocation_t*> live;
  const arcpool_stream_t streams[] = {a, b, registered, unknown, nullptr};
  const uint32_t routes[] = {0, ARCPOOL_DEALLOCATE_FLAG_WAIT_AND_FREE,
                             ARCPOOL_DEALLOCATE_FLAG_PREFER_ORIGIN,
                             ARCPOOL_DEALLOCATE_FLAG_DEFERRED};
  for (int i = 0; i < 40; ++i) {
    arcpool_stream_t origin = streams[i % 5];
    arcpool_allocation_t* h = allocate(i % 3 == 0 ? kBig : kSmall, origin);
    if (i % 4 == 0) {
      live.push_back(h);  // still in use when the rows are read
      continue;
    }
    arcpool_stream_t caller = streams[(i / 5 + i) % 5];
    if (caller != origin) {
      ASSERT_OK(arcpool_transfer(h, caller));
    }
    free_on(h, caller, routes[i % 4]);
  }
  for (arcpool_stream_t s : streams)
    sync(s);
  finish_reclaims();
  const arcpool_stats_t total = stats();
  arcpool_stream_stats_t sum{};
  for (const arcpool_stream_stats_t& r : stream_stats_rows()) {
    sum.bytes_in_use_current += r.bytes_in_use_current;
    sum.allocations += r.allocations;
    sum.cache_hits += r.cache_hits;
    sum.cross_stream_frees += r.cross_stream_frees;
    sum.deferred_frees += r.deferred_frees;
  }
  EXPECT_EQ(total.bytes_in_use_current, sum.bytes_in_use_current);
  EXPECT_EQ(total.allocations, sum.allocations);
  EXPECT_EQ(total.cache_hits, sum.cache_hits);
  EXPECT_EQ(total.cross_stream_frees, sum.cross_stream_frees);
  EXPECT_EQ(total.deferred_frees, sum.deferred_frees);
  EXPECT_NE(0u, sum.cross_stream_frees);
  EXPECT_NE(0u, stream_stats_row(nullptr, /*other=*/true).allocations) << "the unknown stream's";
  for (arcpool_allocation_t* h : live)
    free_on(h, nullptr, ARCPOOL_DEALLOCATE_FLAG_WAIT_AND_FREE);
  sync(nullptr);
  EXPECT_OK(arcpool_stream_unregister(alloc_, registered));
  EXPECT_EQ(1u, stream_stats_row(registered).retired) << "a retired stream keeps its row";
}

TEST_P(StreamStats, TheLegacyDefaultStreamHasARowOfItsOwnFromItsFirstUse) {
  // PyTorch's and CuPy's default stream: a row with a NULL stream that is not the other row,
  // taken when the stream is first used, and counted like a created stream's, on the fast path
  // (the hit and the free into its cache) as on the general one.
  EXPECT_EQ(1u, stream_stats_rows().size()) << "no row before its first use";
  arcpool_stream_t unknown = make_app_stream();
  for (int i = 0; i < 3; ++i)
    free_on(allocate(kSmall, nullptr), nullptr);
  arcpool_allocation_t* big = allocate(kBig, nullptr);
  free_on(allocate(kSmall, unknown), unknown);
  ASSERT_EQ(2u, stream_stats_rows().size());
  arcpool_stream_stats_t legacy = stream_stats_row(nullptr);
  EXPECT_EQ(0u, legacy.other);
  EXPECT_EQ(4u, legacy.allocations);
  EXPECT_EQ(2u, legacy.cache_hits);
  EXPECT_EQ(kBig, legacy.bytes_in_use_current);
  EXPECT_EQ(kBig, legacy.bytes_in_use_peak);
  const arcpool_stream_stats_t other = stream_stats_row(nullptr, /*other=*/true);
  EXPECT_EQ(1u, other.allocations) << "only the unknown stream's";
  EXPECT_EQ(0u, other.bytes_in_use_current);
  free_on(big, nullptr);
  sync(nullptr);
  finish_reclaims();
  legacy = stream_stats_row(nullptr);
  EXPECT_EQ(0u, legacy.bytes_in_use_current);
  EXPECT_EQ(0u, stats().bytes_in_use_current);
}

TEST_P(StreamStats, TwoThreadsRegisteringOneStreamLeaveOneRow) {
  // Both registrations find the stream unknown and build an entry; the registry adds one. The
  // other must not keep a row of its own (a second row for the stream, counting nothing, and
  // one row fewer for later streams). Repeated, so that the two often meet in that window; a
  // later round's stream may reuse an earlier one's handle, whose row is retired.
  for (size_t round = 0; round < ARCPOOL_STREAM_STATS_ROWS - 4; ++round) {
    arcpool_stream_t s = make_app_stream();
    std::atomic<int> ready{0};
    auto register_it = [&] {
      ready.fetch_add(1);
      while (ready.load() < 2) {
      }
      EXPECT_OK(arcpool_stream_register(alloc_, s));
    };
    std::thread other(register_it);
    register_it();
    other.join();
    size_t rows_of_s = 0;
    for (const arcpool_stream_stats_t& r : stream_stats_rows())
      rows_of_s += r.other == 0 && r.retired == 0 && r.stream == s ? 1 : 0;
    ASSERT_EQ(1u, rows_of_s) << "round " << round;
    ASSERT_OK(arcpool_stream_unregister(alloc_, s));  // registrations are counted: both
    ASSERT_OK(arcpool_stream_unregister(alloc_, s));
    destroy_app_stream(s);
  }
  EXPECT_EQ(size_t{ARCPOOL_STREAM_STATS_ROWS} - 3, stream_stats_rows().size())
      << "one row per stream";
}

TEST_P(StreamStats, StreamsBeyondTheTableShareTheOtherRow) {
  std::vector<arcpool_stream_t> made;
  for (size_t i = 0; i < ARCPOOL_STREAM_STATS_ROWS + 2; ++i)
    made.push_back(make_stream());
  EXPECT_EQ(size_t{ARCPOOL_STREAM_STATS_ROWS} + 1, stream_stats_rows().size()) << "bounded";
  // Its cache's lock does not guard the shared row: the hit and the free into the cache count
  // on it all the same.
  free_on(allocate(kSmall, made.back()), made.back());
  free_on(allocate(kSmall, made.back()), made.back());
  const arcpool_stream_stats_t other = stream_stats_row(nullptr, /*other=*/true);
  EXPECT_EQ(2u, other.allocations);
  EXPECT_EQ(1u, other.cache_hits);
  EXPECT_EQ(0u, other.bytes_in_use_current);
  EXPECT_EQ(kSmall, other.bytes_in_use_peak);
}

TEST_P(StreamStats, TheListSizesItselfAndRefusesRowsTooSmall) {
  size_t count = 0;
  ASSERT_OK(arcpool_stream_stats_list(alloc_, nullptr, sizeof(arcpool_stream_stats_t), 0, &count));
  EXPECT_EQ(1u, count) << "only the other-streams row";
  arcpool_stream_t s = make_stream();
  ASSERT_OK(arcpool_stream_stats_list(alloc_, nullptr, sizeof(arcpool_stream_stats_t), 0, &count));
  EXPECT_EQ(2u, count);
  // An older, smaller row: its prefix, and nothing written past it.
  const size_t old_size = offsetof(arcpool_stream_stats_t, bytes_in_use_peak);
  std::vector<unsigned char> raw(2 * old_size + 8, 0xAB);
  ASSERT_OK(arcpool_stream_stats_list(alloc_, reinterpret_cast<arcpool_stream_stats_t*>(raw.data()),
                                      old_size, 2, &count));
  arcpool_stream_t first = nullptr;
  std::memcpy(&first, raw.data(), sizeof(first));
  EXPECT_EQ(s, first);
  EXPECT_EQ(0xAB, raw[2 * old_size]);
  EXPECT_STATUS(ARCPOOL_STATUS_INVALID_ARGUMENT,
                arcpool_stream_stats_list(
                    alloc_, reinterpret_cast<arcpool_stream_stats_t*>(raw.data()), 8, 2, &count));
  EXPECT_STATUS(
      ARCPOOL_STATUS_INVALID_ARGUMENT,
      arcpool_stream_stats_list(alloc_, nullptr, sizeof(arcpool_stream_stats_t), 2, &count));
  // JSON has the same rows.
  size_t length = 0;
  ASSERT_OK(arcpool_stats_json(alloc_, nullptr, 0, &length));
  std::string json(length + 1, '\0');
  ASSERT_OK(arcpool_stats_json(alloc_, json.data(), json.size(), nullptr));
  EXPECT_NE(std::string::npos, json.find("\"streams\": [{\"stream\": "));
  EXPECT_NE(std::string::npos, json.find("\"other\": 1"));
}

ARCPOOL_INSTANTIATE_FOR_ALL_DRIVERS(StreamStats);

}  // namespace
}  // namespace arcpool::test
