// The memory history and its snapshot in PyTorch's format (design.md §11, issue 12): one
// segment per block arcpool holds, its state following the allocation in it, totals equal to
// the allocator's statistics, and a bounded ring of what happened. On every driver.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "support/driver_test.hpp"
#include "support/pickle_reader.hpp"

namespace arcpool::test {
namespace {

constexpr size_t kSmall = 4096;                    // cached on the fast path
constexpr size_t kLarge = size_t{2} << 20;         // above the cache's largest block
constexpr size_t kSmallSegment = size_t{1} << 20;  // PyTorch's small/large boundary

uint64_t address(const void* p) {
  return reinterpret_cast<uintptr_t>(p);
}

class MemoryHistory : public DriverTest {
 protected:
  void customize(arcpool_allocator_options_t& options) override {
    options.history_entries = entries();
    options.stream_cache_bytes = size_t{4} << 20;
    options.stream_cache_max_block = size_t{1} << 20;
  }
  virtual size_t entries() const { return 64; }

  pickled snapshot() const {
    size_t size = 0;
    EXPECT_OK(arcpool_memory_snapshot(alloc_, nullptr, 0, &size));
    std::string bytes(size, '\0');
    EXPECT_OK(arcpool_memory_snapshot(alloc_, bytes.data(), bytes.size(), &size));
    return parse_pickle(bytes);
  }
  /// The segment at `p` in `snap`, or null.
  static const pickled* segment_at(const pickled& snap, const void* p) {
    for (const pickled& seg : snap["segments"].items) {
      if (seg["address"].number == address(p)) return &seg;
    }
    return nullptr;
  }
  static std::string state_at(const pickled& snap, const void* p) {
    const pickled* seg = segment_at(snap, p);
    return seg == nullptr ? "absent" : (*seg)["blocks"].items.at(0)["state"].text;
  }
  /// The trace's (action, address) pairs, oldest first.
  static std::vector<std::pair<std::string, uint64_t>> actions(const pickled& snap) {
    const std::vector<pickled>& traces = snap["device_traces"].items;
    EXPECT_FALSE(traces.empty());
    std::vector<std::pair<std::string, uint64_t>> out;
    for (const pickled& e : traces.back().items)
      out.emplace_back(e["action"].text, e["addr"].number);
    return out;
  }
  /// Expects the segments to add up to the statistics, as PyTorch's _memory_viz.py stats adds
  /// them: reserved = every segment's size, allocated = active blocks' requested sizes.
  void expect_totals_are_the_stats(const pickled& snap) const {
    uint64_t reserved = 0, allocated = 0;
    for (const pickled& seg : snap["segments"].items) {
      uint64_t blocks = 0;
      for (const pickled& b : seg["blocks"].items) {
        blocks += b["size"].number;
        if (b["state"].text == "active_allocated") allocated += b["requested_size"].number;
      }
      EXPECT_EQ(seg["total_size"].number, blocks) << "block sizes sum to the segment's";
      reserved += seg["total_size"].number;
    }
    const arcpool_stats_t st = stats();
    EXPECT_EQ(st.bytes_held_current, reserved);
    EXPECT_EQ(st.bytes_in_use_current, allocated);
  }
  void free_on(arcpool_allocation_t* a, arcpool_stream_t s, uint32_t flags = 0) {
    EXPECT_OK(arcpool_deallocate_async(a, s, flags));
    arcpool_allocation_release(a);
  }
};

TEST_P(MemoryHistory, EveryBlockIsASegmentWhoseStateFollowsItsAllocation) {
  arcpool_stream_t s = make_stream();
  arcpool_allocation_t* small = allocate(kSmall, s);
  arcpool_allocation_t* large = allocate(kLarge, s);
  void* const small_block = data(small);
  void* const large_block = data(large);
  pickled snap = snapshot();
  ASSERT_EQ(2u, snap["segments"].items.size());
  const pickled& seg = *segment_at(snap, small_block);
  EXPECT_EQ(kSmall, seg["total_size"].number);
  EXPECT_EQ(address(s), seg["stream"].number);
  EXPECT_EQ("small", seg["segment_type"].text);
  EXPECT_EQ(kSmall, seg["blocks"].items.at(0)["requested_size"].number);
  EXPECT_TRUE(seg.has("frames") && seg["blocks"].items.at(0).has("frames"));
  EXPECT_EQ("large", (*segment_at(snap, large_block))["segment_type"].text);
  EXPECT_EQ("active_allocated", state_at(snap, small_block));
  EXPECT_EQ("active_allocated", state_at(snap, large_block));
  expect_totals_are_the_stats(snap);

  free_on(small, s);  // kept by the stream's cache
  free_on(large, s);  // too large to cache: back to the pool
  snap = snapshot();
  EXPECT_EQ("inactive", state_at(snap, small_block)) << "a cached block stays held";
  EXPECT_EQ("absent", state_at(snap, large_block)) << "a block given back leaves the snapshot";
  expect_totals_are_the_stats(snap);

  arcpool_allocation_t* again = allocate(kSmall, s);
  ASSERT_EQ(small_block, data(again)) << "the cache hands the block back";
  snap = snapshot();
  EXPECT_EQ("active_allocated", state_at(snap, small_block));
  expect_totals_are_the_stats(snap);
  const std::vector<std::pair<std::string, uint64_t>> expected = {
      {"segment_alloc", address(small_block)},  {"alloc", address(small_block)},
      {"segment_alloc", address(large_block)},  {"alloc", address(large_block)},
      {"free_requested", address(small_block)}, {"free_completed", address(small_block)},
      {"free_requested", address(large_block)}, {"free_completed", address(large_block)},
      {"segment_free", address(large_block)},   {"alloc", address(small_block)}};
  EXPECT_EQ(expected, actions(snap));
  for (const pickled& e : snap["device_traces"].items.back().items) {
    EXPECT_EQ(address(s), e["stream"].number);
    EXPECT_GT(e["time_us"].number, 0u);
    EXPECT_TRUE(e.has("frames") && e.has("size"));
  }
  free_on(again, s);
  sync(s);
}

// An alignment above the pool's is served from a padded block aligned up: the trace names the
// pointer the caller got (as PyTorch's alloc entry names the pointer handed out), and the
// segment's blocks are the padding, free, then the allocation at that pointer. Both named the
// block's start before.
TEST_P(MemoryHistory, AnOverAlignedAllocationIsNamedByItsDataPointer) {
  arcpool_stream_t s = make_stream();
  constexpr size_t kAlignment = size_t{1} << 21;
  arcpool_allocation_t* a = nullptr;
  ASSERT_OK(arcpool_allocate_async(alloc_, kSmall, kAlignment, s, 0, &a));
  void* const p = data(a);
  ASSERT_EQ(0u, address(p) % kAlignment);
  pickled snap = snapshot();
  ASSERT_EQ(1u, snap["segments"].items.size());
  const pickled& seg = snap["segments"].items.at(0);
  const uint64_t base = seg["address"].number;
  const std::vector<pickled>& blocks = seg["blocks"].items;
  if (base == address(p)) {
    ASSERT_EQ(1u, blocks.size()) << "the pool's block happened to be aligned: no padding";
  } else {
    ASSERT_EQ(2u, blocks.size());
    EXPECT_EQ(base, blocks[0]["address"].number);
    EXPECT_EQ(address(p) - base, blocks[0]["size"].number);
    EXPECT_EQ("inactive", blocks[0]["state"].text);
  }
  EXPECT_EQ(address(p), blocks.back()["address"].number);
  EXPECT_EQ("active_allocated", blocks.back()["state"].text);
  EXPECT_EQ(kSmall, blocks.back()["requested_size"].number);
  expect_totals_are_the_stats(snap);
  free_on(a, s);
  sync(s);
  finish_reclaims();
  const std::vector<std::pair<std::string, uint64_t>> expected = {{"segment_alloc", base},
                                                                  {"alloc", address(p)},
                                                                  {"free_requested", address(p)},
                                                                  {"free_completed", address(p)},
                                                                  {"segment_free", base}};
  EXPECT_EQ(expected, actions(snapshot()));
}

TEST_P(MemoryHistory, ADeferredFreeIsPendingUntilItsFencesCompleteThenLeaves) {
  arcpool_stream_t origin = make_stream();
  arcpool_stream_t busy = make_stream();
  arcpool_stream_t caller = make_stream();
  arcpool_allocation_t* a = allocate(kLarge, origin);
  void* const p = data(a);
  ASSERT_OK(arcpool_transfer(a, busy));
  gate& held = block(busy);
  fill_async(busy, p, kLarge, 0x5a);
  free_on(a, caller, ARCPOOL_DEALLOCATE_FLAG_DEFERRED);
  run_unheld({caller, origin});
  pickled snap = snapshot();
  EXPECT_EQ("active_pending_free", state_at(snap, p))
      << "the busy stream may still write: the free has not completed";
  EXPECT_EQ(kLarge, (*segment_at(snap, p))["active_size"].number);
  EXPECT_EQ(0u, (*segment_at(snap, p))["allocated_size"].number);
  expect_totals_are_the_stats(snap);

  held.open();
  sync(busy);
  sync(caller);
  finish_reclaims();
  sync(origin);
  snap = snapshot();
  EXPECT_EQ("absent", state_at(snap, p));
  expect_totals_are_the_stats(snap);
  const std::vector<std::pair<std::string, uint64_t>> expected = {{"segment_alloc", address(p)},
                                                                  {"alloc", address(p)},
                                                                  {"free_requested", address(p)},
                                                                  {"free_completed", address(p)},
                                                                  {"segment_free", address(p)}};
  EXPECT_EQ(expected, actions(snap));
}

TEST_P(MemoryHistory, SizingAndBadBuffersWriteNothing) {
  arcpool_stream_t s = make_stream();
  arcpool_allocation_t* a = allocate(kSmall, s);
  size_t size = 0;
  ASSERT_OK(arcpool_memory_snapshot(alloc_, nullptr, 0, &size));
  ASSERT_GT(size, 2u);
  std::string buffer(size - 1, '\xAB');
  size_t reported = 0;
  EXPECT_STATUS(ARCPOOL_STATUS_INVALID_ARGUMENT,
                arcpool_memory_snapshot(alloc_, buffer.data(), buffer.size(), &reported));
  EXPECT_EQ(size, reported) << "a short buffer still learns the size";
  EXPECT_EQ(std::string(size - 1, '\xAB'), buffer) << "nothing written to a short buffer";
  EXPECT_STATUS(ARCPOOL_STATUS_INVALID_ARGUMENT,
                arcpool_memory_snapshot(alloc_, nullptr, 0, nullptr));
  EXPECT_STATUS(ARCPOOL_STATUS_INVALID_ARGUMENT,
                arcpool_memory_snapshot(alloc_, nullptr, 16, &reported));
  free_on(a, s);
  sync(s);
}

TEST_P(MemoryHistory, ThreadsRecordTogetherAndTheTotalsStayTheStats) {
  ARCPOOL_SKIP_ON_DETERMINISTIC("the threads allocate and snapshot concurrently");
  constexpr int kThreads = 4;
  constexpr int kRounds = 100;
  std::vector<arcpool_stream_t> streams;
  for (int t = 0; t < kThreads; ++t)
    streams.push_back(make_stream());
  arcpool_stream_t freer = make_stream();
  std::vector<std::vector<arcpool_allocation_t*>> handed(kThreads);
  std::atomic<bool> done{false};
  std::thread reader([&] {
    while (!done.load()) {
      size_t size = 0;
      EXPECT_OK(arcpool_memory_snapshot(alloc_, nullptr, 0, &size));
    }
  });
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kRounds; ++i) {
        const size_t bytes = (i % 3 == 0 ? kLarge : kSmall) + 256 * (i % 4);
        arcpool_allocation_t* a = nullptr;
        EXPECT_OK(arcpool_allocate_async(alloc_, bytes, 0, streams[t], 0, &a));
        if (i % 2 == 0) {
          handed[t].push_back(a);  // freed later from another thread and stream
        } else {
          free_on(a, streams[t]);
        }
      }
    });
  }
  for (std::thread& t : threads)
    t.join();
  done.store(true);
  reader.join();
  for (std::vector<arcpool_allocation_t*>& list : handed) {
    for (arcpool_allocation_t* a : list)
      free_on(a, freer, ARCPOOL_DEALLOCATE_FLAG_DEFERRED);
  }
  for (arcpool_stream_t s : streams)
    sync(s);
  sync(freer);
  finish_reclaims();
  const pickled snap = snapshot();
  for (const pickled& seg : snap["segments"].items)
    EXPECT_EQ("inactive", seg["blocks"].items.at(0)["state"].text) << "only cached blocks remain";
  expect_totals_are_the_stats(snap);
  EXPECT_EQ(64u, snap["device_traces"].items.back().items.size()) << "the ring is full";
}

ARCPOOL_INSTANTIATE_FOR_ALL_DRIVERS(MemoryHistory);

/// A ring of four entries.
class MemoryHistoryRing : public MemoryHistory {
 protected:
  size_t entries() const override { return 4; }
};

TEST_P(MemoryHistoryRing, KeepsTheNewestEntriesAndEveryBlock) {
  arcpool_stream_t s = make_stream();
  arcpool_allocation_t* kept = allocate(kSmall, s);  // its entries leave the ring
  void* last = nullptr;
  for (int i = 0; i < 5; ++i) {
    arcpool_allocation_t* a = allocate(kLarge, s);
    last = data(a);
    free_on(a, s);
  }
  const pickled snap = snapshot();
  const std::vector<std::pair<std::string, uint64_t>> expected = {{"alloc", address(last)},
                                                                  {"free_requested", address(last)},
                                                                  {"free_completed", address(last)},
                                                                  {"segment_free", address(last)}};
  EXPECT_EQ(expected, actions(snap));
  EXPECT_EQ("active_allocated", state_at(snap, data(kept)))
      << "the block table is whole when the ring has wrapped";
  expect_totals_are_the_stats(snap);
  free_on(kept, s);
  sync(s);
}

ARCPOOL_INSTANTIATE_FOR_ALL_DRIVERS(MemoryHistoryRing);

/// Without history.
class MemoryHistoryOff : public DriverTest {};

TEST_P(MemoryHistoryOff, ASnapshotIsUnsupportedAndSaysHowToTurnItOn) {
  size_t size = 0;
  EXPECT_STATUS(ARCPOOL_STATUS_UNSUPPORTED, arcpool_memory_snapshot(alloc_, nullptr, 0, &size));
  EXPECT_NE(nullptr, std::strstr(arcpool_last_error(), "ARCPOOL_HISTORY"));
}

ARCPOOL_INSTANTIATE_FOR_ALL_DRIVERS(MemoryHistoryOff);

TEST(MemoryHistoryEnvironment, ArcpoolHistoryTurnsItOnAndAMalformedValueIsRefused) {
  arcpool_allocator_options_t options;
  arcpool_allocator_options_init(&options);
  options.driver = ARCPOOL_DRIVER_HOST;
  ASSERT_EQ(0, setenv("ARCPOOL_HISTORY", "8", 1));
  arcpool_allocator_t* a = nullptr;
  ASSERT_OK(arcpool_allocator_create(&options, &a));
  size_t size = 0;
  EXPECT_OK(arcpool_memory_snapshot(a, nullptr, 0, &size));
  arcpool_allocator_destroy(a);
  // " -1": strtoull skips the space and wraps the minus sign to 2^64 - 1, whose ring could not
  // be made ("internal error: vector::reserve", naming no history).
  for (const char* bad : {"eight", "-1", "8x", " -1", "18446744073709551615"}) {
    ASSERT_EQ(0, setenv("ARCPOOL_HISTORY", bad, 1));
    a = nullptr;
    EXPECT_STATUS(ARCPOOL_STATUS_INVALID_ARGUMENT, arcpool_allocator_create(&options, &a)) << bad;
    EXPECT_NE(nullptr, std::strstr(arcpool_last_error(), "ARCPOOL_HISTORY")) << bad;
    EXPECT_EQ(nullptr, a);
  }
  ASSERT_EQ(0, unsetenv("ARCPOOL_HISTORY"));
  options.history_entries = SIZE_MAX;
  a = nullptr;
  EXPECT_STATUS(ARCPOOL_STATUS_INVALID_ARGUMENT, arcpool_allocator_create(&options, &a));
  EXPECT_NE(nullptr, std::strstr(arcpool_last_error(), "a memory history of"))
      << arcpool_last_error();
  EXPECT_EQ(nullptr, a);
}

}  // namespace
}  // namespace arcpool::test
