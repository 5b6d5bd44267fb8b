// Many host threads on shared allocations: every count must add up at the end. Run under TSan
// in CI, where a missing lock or a wrong memory order is reported.
#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "support/driver_test.hpp"

namespace arcpool::test {
namespace {

constexpr int kThreads = 16;

class Concurrency : public DriverTest {};

TEST_P(Concurrency, SixteenThreadsAllocatePreserveDiscardTransferDeallocate) {
  constexpr int kShared = 32;
  constexpr int kRounds = 150;
  std::vector<arcpool_stream_t> streams;
  for (int t = 0; t < kThreads; ++t)
    streams.push_back(make_stream());

  // Shared allocations: each thread holds one extra claim (and reference) on every one.
  std::vector<arcpool_allocation_t*> shared;
  for (int i = 0; i < kShared; ++i) {
    arcpool_allocation_t* a = allocate(4096, streams[i % kThreads]);
    for (int t = 0; t < kThreads; ++t) {
      EXPECT_OK(arcpool_allocation_preserve(a));
      EXPECT_OK(arcpool_allocation_retain(a));
    }
    shared.push_back(a);
  }

  std::atomic<int> errors{0};
  auto check = [&](arcpool_status_t s) {
    if (s != ARCPOOL_STATUS_SUCCESS) errors.fetch_add(1);
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(1234 + t);
      arcpool_stream_t mine = streams[t];
      for (int round = 0; round < kRounds; ++round) {
        arcpool_allocation_t* a = shared[rng() % kShared];
        check(arcpool_allocation_preserve(a));
        switch (rng() % 3) {
          case 0:
            check(arcpool_transfer(a, mine));
            break;
          case 1:
            check(arcpool_record_use(a, mine));
            break;
          default: {
            arcpool_allocation_t* v = nullptr;
            check(arcpool_allocation_view(a, 64, 64, &v));
            arcpool_allocation_release(v);
          }
        }
        int last = 1;
        check(arcpool_allocation_discard(a, &last));
        if (last != 0) errors.fetch_add(1);  // every thread still holds its own claim
        // A private allocation handed to another stream and freed from a third.
        arcpool_allocation_t* p = nullptr;
        check(arcpool_allocate_async(alloc_, 256 + (rng() % 8192), 0, mine, 0, &p));
        check(arcpool_transfer(p, streams[rng() % kThreads]));
        check(arcpool_deallocate_async(p, streams[rng() % kThreads], 0));
        arcpool_allocation_release(p);
      }
      // Give back this thread's claim and reference on every shared allocation; whoever drops
      // the last claim deallocates.
      for (arcpool_allocation_t* a : shared) {
        int last = 0;
        check(arcpool_allocation_discard(a, &last));
        if (last != 0) check(arcpool_deallocate_async(a, mine, 0));
        arcpool_allocation_release(a);
      }
    });
  }
  for (auto& th : threads)
    th.join();
  EXPECT_EQ(0, errors.load()) << arcpool_last_error();

  // Only the creator's claim remains on each shared allocation.
  for (arcpool_allocation_t* a : shared) {
    const auto i = info(a);
    EXPECT_EQ(ARCPOOL_ALLOCATION_LIVE, i.state);
    EXPECT_EQ(1u, i.owners);
    EXPECT_EQ(1u, i.references);
    EXPECT_OK(arcpool_deallocate_async(a, streams[0], 0));
    arcpool_allocation_release(a);
  }
  for (arcpool_stream_t s : streams)
    sync(s);
  finish_reclaims();
  const auto st = stats();
  const uint64_t allocations = kShared + uint64_t{kThreads} * kRounds;
  EXPECT_EQ(allocations, st.allocations);
  EXPECT_EQ(allocations, st.deallocations);
  EXPECT_EQ(allocations, st.frees);
  EXPECT_EQ(0u, st.bytes_in_use_current);
  EXPECT_EQ(0u, st.bytes_held_current);
  EXPECT_EQ(0u, st.allocations_in_use_current);
  if (on_host()) {
    EXPECT_EQ(0u, pool_used());
  }
}

TEST_P(Concurrency, ExactlyOneConcurrentDiscardIsTheLast) {
  arcpool_stream_t s = make_stream();
  for (int trial = 0; trial < 20; ++trial) {
    arcpool_allocation_t* a = allocate(1024, s);
    for (int t = 1; t < kThreads; ++t)
      EXPECT_OK(arcpool_allocation_preserve(a));
    std::atomic<int> lasts{0};
    std::atomic<int> errors{0};
    std::atomic<bool> go{false};
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&] {
        while (!go.load())
          std::this_thread::yield();
        int last = 0;
        if (arcpool_allocation_discard(a, &last) != ARCPOOL_STATUS_SUCCESS) errors.fetch_add(1);
        lasts.fetch_add(last);
      });
    }
    go = true;
    for (auto& th : threads)
      th.join();
    EXPECT_EQ(1, lasts.load());
    EXPECT_EQ(0, errors.load());
    EXPECT_STATUS(ARCPOOL_STATUS_NOT_OWNER, arcpool_allocation_discard(a, nullptr));
    EXPECT_OK(arcpool_deallocate_async(a, s, 0));
    arcpool_allocation_release(a);
  }
}

TEST_P(Concurrency, ConcurrentDeallocationsAcceptExactlyOne) {
  arcpool_stream_t s = make_stream();
  for (int trial = 0; trial < 20; ++trial) {
    arcpool_allocation_t* a = allocate(1024, s);
    std::atomic<int> accepted{0};
    std::atomic<int> already{0};
    std::atomic<bool> go{false};
    std::vector<std::thread> threads;
    for (int t = 0; t < 8; ++t) {
      threads.emplace_back([&] {
        while (!go.load())
          std::this_thread::yield();
        const arcpool_status_t status = arcpool_deallocate_async(a, s, 0);
        if (status == ARCPOOL_STATUS_SUCCESS) accepted.fetch_add(1);
        if (status == ARCPOOL_STATUS_ALREADY_DEALLOCATED) already.fetch_add(1);
      });
    }
    go = true;
    for (auto& th : threads)
      th.join();
    EXPECT_EQ(1, accepted.load());
    EXPECT_EQ(7, already.load());
    arcpool_allocation_release(a);
  }
  sync(s);
  EXPECT_EQ(20u, stats().frees);
}

/// Threads unregister one registered stream at once: exactly one call retires it, and the
/// others are told the stream is not (or no longer) registered. (Each found the entry alive
/// before any removed it, and every one succeeded.) The same claim keeps racing destroys of a
/// created stream from destroying it twice, but those pass a handle that may be gone already,
/// which CUDA does not allow: the application's part, so not tested here.
TEST_P(Concurrency, ConcurrentUnregistrationsOfAStreamAcceptExactlyOne) {
  arcpool_stream_t app = make_app_stream();
  for (int trial = 0; trial < 200; ++trial) {
    ASSERT_OK(arcpool_stream_register(alloc_, app));
    std::atomic<int> accepted{0};
    std::atomic<int> refused{0};
    std::atomic<int> ready{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&] {
        ready.fetch_add(1);
        while (ready.load() != 4)
          std::this_thread::yield();
        const arcpool_status_t status = arcpool_stream_unregister(alloc_, app);
        if (status == ARCPOOL_STATUS_SUCCESS) accepted.fetch_add(1);
        if (status == ARCPOOL_STATUS_INVALID_ARGUMENT) refused.fetch_add(1);
      });
    }
    for (auto& th : threads)
      th.join();
    ASSERT_EQ(1, accepted.load()) << "trial " << trial;
    ASSERT_EQ(3, refused.load()) << "trial " << trial;
  }
  destroy_app_stream(app);
}

/// By pointer, as frameworks call: threads allocate on their own streams and free one another's
/// pointers, exact or interior, through the sharded by-pointer map. Every free finds its
/// allocation once, and the counts add up.
TEST_P(Concurrency, ThreadsFreeOneAnothersPointersThroughTheMap) {
  constexpr int kWorkers = 8;
  constexpr int kPerThread = 200;
  constexpr size_t kBytes = 512;
  std::vector<arcpool_stream_t> streams;
  for (int t = 0; t < kWorkers; ++t)
    streams.push_back(make_stream());
  std::mutex handed_mutex;
  std::vector<char*> handed;  // allocated by one thread, freed by whichever takes it
  std::atomic<int> errors{0};
  std::atomic<int> freed{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kWorkers; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(99 + t);
      for (int i = 0; i < kPerThread; ++i) {
        void* p = nullptr;
        if (arcpool_allocator_malloc_async(alloc_, kBytes, 0, streams[t], &p) !=
            ARCPOOL_STATUS_SUCCESS) {
          errors.fetch_add(1);
          continue;
        }
        char* theirs = nullptr;
        {
          std::lock_guard<std::mutex> lock(handed_mutex);
          handed.push_back(static_cast<char*>(p));
          if (handed.size() > 4) {
            std::swap(handed[rng() % handed.size()], handed.back());
            theirs = handed.back();
            handed.pop_back();
          }
        }
        if (theirs == nullptr) continue;
        char* at = rng() % 2 == 0 ? theirs : theirs + 1 + rng() % (kBytes - 1);
        if (arcpool_allocator_free_async(alloc_, at, streams[t]) != ARCPOOL_STATUS_SUCCESS) {
          errors.fetch_add(1);
        } else {
          freed.fetch_add(1);
        }
      }
    });
  }
  for (auto& th : threads)
    th.join();
  for (char* p : handed) {
    EXPECT_OK(arcpool_allocator_free_async(alloc_, p, streams[0]));
    freed.fetch_add(1);
  }
  EXPECT_EQ(0, errors.load());
  EXPECT_EQ(kWorkers * kPerThread, freed.load());
  for (arcpool_stream_t s : streams)
    sync(s);
  finish_reclaims();
  EXPECT_EQ(0u, stats().bytes_in_use_current);
  EXPECT_EQ(0u, stats().allocations_in_use_current);
}

/// With the stream caches on: the fast path (cache hits and same-stream frees into the cache).
class ConcurrentFastPath : public DriverTest {
 protected:
  void customize(arcpool_allocator_options_t& options) override {
    options.stream_cache_bytes = size_t{1} << 20;
    options.stream_cache_max_block = size_t{1} << 20;
  }
};

/// The first 63 live threads own a statistics shard and write it with plain stores; the others
/// share the last one atomically (support/shards.hpp), and the fast path tests which it has.
/// With more threads alive at once than there are owned shards, no count may go missing.
TEST_P(ConcurrentFastPath, ThreadsBeyondTheOwnedShardsLoseNoCount) {
  constexpr int kMany = 72;
  constexpr uint64_t kPairs = 300;
  const arcpool_stream_t s = make_stream();
  const arcpool_stats_t before = stats();
  std::atomic<int> arrived{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kMany; ++t) {
    threads.emplace_back([&] {
      arcpool_allocation_t* first = nullptr;  // takes the thread's shard
      EXPECT_OK(arcpool_allocate_async(alloc_, 4096, 0, s, 0, &first));
      arrived.fetch_add(1);
      while (arrived.load() < kMany)
        std::this_thread::yield();  // all alive at once
      for (uint64_t i = 0; i < kPairs; ++i) {
        arcpool_allocation_t* a = nullptr;
        EXPECT_OK(arcpool_allocate_async(alloc_, 4096, 0, s, 0, &a));
        EXPECT_OK(arcpool_deallocate_async(a, s, 0));
        arcpool_allocation_release(a);
      }
      EXPECT_OK(arcpool_deallocate_async(first, s, 0));
      arcpool_allocation_release(first);
    });
  }
  for (std::thread& t : threads)
    t.join();
  sync(s);
  const arcpool_stats_t after = stats();
  const uint64_t n = kMany * (kPairs + 1);
  EXPECT_EQ(n, after.allocations - before.allocations);
  EXPECT_EQ(n, after.deallocations - before.deallocations);
  EXPECT_EQ(n, after.same_stream_frees - before.same_stream_frees);
  EXPECT_EQ(n, (after.cache_frees - before.cache_frees) + (after.frees - before.frees));
  EXPECT_GT(after.cache_hits, before.cache_hits);
  EXPECT_EQ(before.allocations_in_use_current, after.allocations_in_use_current);
  EXPECT_EQ(before.bytes_in_use_current, after.bytes_in_use_current);
}

/// A stream's own statistics row changes with plain stores under its cache's lock: on the fast
/// path inside the cache's take or put, elsewhere (uncached allocations, frees on other streams)
/// by taking that lock. Threads sharing one stream, on every path at once, lose no update.
TEST_P(ConcurrentFastPath, OneStreamsRowLosesNoUpdateFromConcurrentPaths) {
  constexpr int kWorkers = 4;
  constexpr int kRounds = 2000;
  constexpr size_t kSmall = 4096;           // cached: the fast path
  constexpr size_t kBig = size_t{2} << 20;  // above stream_cache_max_block: never cached
  const arcpool_stream_t shared = make_stream();
  std::vector<arcpool_stream_t> own;
  for (int t = 0; t < kWorkers; ++t)
    own.push_back(make_stream());
  std::atomic<int> errors{0};
  auto check = [&](arcpool_status_t status) {
    if (status != ARCPOOL_STATUS_SUCCESS) errors.fetch_add(1);
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kWorkers; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kRounds; ++i) {
        arcpool_allocation_t* a = nullptr;
        const bool big = i % 7 == 3;
        check(arcpool_allocate_async(alloc_, big ? kBig : kSmall, 0, shared, 0, &a));
        if (a == nullptr) continue;
        if (i % 3 == 1) {
          // Freed on another stream: the row's free outside its cache's take and put.
          check(arcpool_transfer(a, own[t]));
          check(arcpool_deallocate_async(a, own[t], ARCPOOL_DEALLOCATE_FLAG_WAIT_AND_FREE));
        } else {
          check(arcpool_deallocate_async(a, shared, 0));
        }
        arcpool_allocation_release(a);
      }
    });
  }
  for (std::thread& th : threads)
    th.join();
  sync(shared);
  for (arcpool_stream_t s : own)
    sync(s);
  finish_reclaims();
  EXPECT_EQ(0, errors.load());
  std::vector<arcpool_stream_stats_t> rows(ARCPOOL_STREAM_STATS_ROWS + 1);
  size_t count = 0;
  ASSERT_OK(arcpool_stream_stats_list(alloc_, rows.data(), sizeof(rows[0]), rows.size(), &count));
  rows.resize(count);
  bool found = false;
  for (const arcpool_stream_stats_t& r : rows) {
    if (r.other != 0 || r.stream != shared) continue;
    found = true;
    EXPECT_EQ(0u, r.bytes_in_use_current) << "a lost change of the bytes in use";
    EXPECT_EQ(uint64_t{kWorkers} * kRounds, r.allocations) << "a lost allocation count";
    EXPECT_GT(r.cache_hits, 0u);
    EXPECT_GE(r.bytes_in_use_peak, kBig);
  }
  EXPECT_TRUE(found) << "no row for the shared stream";
}

ARCPOOL_INSTANTIATE_FOR_DRIVERS(Concurrency);
ARCPOOL_INSTANTIATE_FOR_DRIVERS(ConcurrentFastPath);

}  // namespace
}  // namespace arcpool::test
