// The deterministic host driver (seeded scheduler) and its happens-before checker.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/allocator.hpp"
#include "drivers/deterministic.hpp"
#include "support/driver_test.hpp"

namespace arcpool::test {
namespace {

namespace det = detail::deterministic;

/// A deterministic allocator with `seed`, its driver and a few streams.
struct world {
  arcpool_allocator_t* alloc = nullptr;
  std::vector<arcpool_stream_t> s;
  explicit world(uint64_t seed, size_t cache_bytes = 0) {
    arcpool_allocator_options_t o;
    arcpool_allocator_options_init(&o);
    o.driver = ARCPOOL_DRIVER_HOST;
    o.host_deterministic_seed = seed;
    o.stream_cache_bytes = cache_bytes;
    EXPECT_OK(arcpool_allocator_create(&o, &alloc));
    for (int i = 0; i < 4; ++i) {
      arcpool_stream_t st = nullptr;
      EXPECT_OK(arcpool_stream_create(alloc, &st));
      s.push_back(st);
    }
  }
  ~world() {
    for (auto st : s)
      arcpool_stream_destroy(alloc, st);
    arcpool_allocator_destroy(alloc);
  }
  detail::driver& drv() { return detail::from_handle(alloc)->drv(); }
  std::vector<std::string> violations() { return det::violations(drv()); }
  void* data(arcpool_allocation_t* a) {
    void* p = nullptr;
    EXPECT_OK(arcpool_allocation_data(a, &p));
    return p;
  }
  void finish() {
    for (auto st : s)
      EXPECT_OK(arcpool_stream_synchronize(alloc, st));
    EXPECT_OK(arcpool_allocator_trim(alloc, 0));
  }
};

std::string joined(const std::vector<std::string>& v) {
  std::string all;
  for (const auto& x : v)
    all += x + "\n";
  return all;
}

TEST(Deterministic, TheSameSeedRunsTheSameSchedule) {
  auto schedule = [](uint64_t seed) {
    world w(seed);
    std::vector<int>* order = new std::vector<int>();
    struct tag {
      std::vector<int>* order;
      int value;
    };
    std::vector<tag> tags;
    tags.reserve(64);
    for (int i = 0; i < 64; ++i)
      tags.push_back({order, i});
    for (int i = 0; i < 64; ++i) {
      EXPECT_OK(arcpool_stream_launch_host_func(
          w.alloc, w.s[i % 4],
          [](void* p) {
            auto* t = static_cast<tag*>(p);
            t->order->push_back(t->value);
          },
          &tags[i]));
    }
    det::run(w.drv());
    std::vector<int> result = *order;
    delete order;
    return result;
  };
  EXPECT_EQ(schedule(7), schedule(7));
  EXPECT_NE(schedule(7), schedule(8)) << "another seed interleaves the streams otherwise";
  EXPECT_EQ(64u, schedule(9).size());
}

TEST(Deterministic, NothingRunsUntilTheCallerDrivesTheScheduler) {
  world w(3);
  bool ran = false;
  EXPECT_OK(arcpool_stream_launch_host_func(
      w.alloc, w.s[0], [](void* p) { *static_cast<bool*>(p) = true; }, &ran));
  EXPECT_FALSE(ran);
  EXPECT_OK(arcpool_stream_synchronize(w.alloc, w.s[0]));
  EXPECT_TRUE(ran);
}

TEST(Deterministic, ACorrectProgramHasNoViolationsUnderEveryStrategyAndSeed) {
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    for (uint32_t flag : {uint32_t{0}, uint32_t{ARCPOOL_DEALLOCATE_FLAG_WAIT_AND_FREE},
                          uint32_t{ARCPOOL_DEALLOCATE_FLAG_PREFER_ORIGIN},
                          uint32_t{ARCPOOL_DEALLOCATE_FLAG_DEFERRED}}) {
      world w(seed, seed % 2 ? size_t{1} << 20 : 0);  // the fast path on for odd seeds
      for (int round = 0; round < 3; ++round) {
        arcpool_allocation_t* a = nullptr;
        ASSERT_OK(arcpool_allocate_async(w.alloc, 4096, 0, w.s[0], 0, &a));
        void* p = w.data(a);
        ASSERT_OK(det::access(w.drv(), p, 4096, w.s[0], "producer write"));
        ASSERT_OK(arcpool_transfer(a, w.s[1]));
        ASSERT_OK(det::access(w.drv(), p, 4096, w.s[1], "consumer write"));
        ASSERT_OK(det::wait_stream(w.drv(), w.s[2], w.s[1]));
        ASSERT_OK(det::access(w.drv(), p, 64, w.s[2], "side read"));
        ASSERT_OK(arcpool_record_use(a, w.s[2]));
        ASSERT_OK(arcpool_deallocate_async(a, w.s[3], flag));
        ASSERT_OK(arcpool_allocation_release(a));
        det::run(w.drv(), 5);  // interleave a little before the next round
        detail::from_handle(w.alloc)->reclaim_poll_once();
      }
      w.finish();
      EXPECT_EQ("", joined(w.violations())) << "seed " << seed << " flag " << flag;
    }
  }
}

TEST(Deterministic, AMissingFenceIsACertainFailureNamingBothOperations) {
  for (uint64_t seed = 1; seed <= 50; ++seed) {
    world w(seed);
    detail::driver& d = w.drv();
    void* p = nullptr;
    ASSERT_OK(d.pool_allocate(1024, w.s[0], &p));
    ASSERT_OK(det::access(d, p, 1024, w.s[0], "kernel K"));
    ASSERT_OK(d.pool_free(p, 1024, w.s[1]));  // no wait on s[0]: wrong
    det::run(d);
    const std::string v = joined(w.violations());
    EXPECT_NE(std::string::npos, v.find("kernel K")) << "seed " << seed << ":\n" << v;
    EXPECT_TRUE(v.find("pool free") != std::string::npos ||
                v.find("use after") != std::string::npos)
        << v;
  }
}

TEST(Deterministic, UnorderedAccessesAreACertainRace) {
  for (uint64_t seed = 1; seed <= 50; ++seed) {
    world w(seed);
    detail::driver& d = w.drv();
    void* p = nullptr;
    ASSERT_OK(d.pool_allocate(1024, w.s[0], &p));
    ASSERT_OK(det::wait_stream(d, w.s[1], w.s[0]));  // both after the allocation
    ASSERT_OK(det::access(d, p, 8, w.s[0], "writer A"));
    ASSERT_OK(det::access(d, p, 8, w.s[1], "writer B"));
    det::run(d);
    const std::string v = joined(w.violations());
    EXPECT_NE(std::string::npos, v.find("races with")) << "seed " << seed << ":\n" << v;
    ASSERT_OK(d.pool_free(p, 1024, w.s[0]));
    det::run(d);
  }
}

TEST(Deterministic, AnAccessBeforeTheAllocationIsReported) {
  world w(5);
  detail::driver& d = w.drv();
  void* p = nullptr;
  ASSERT_OK(d.pool_allocate(256, w.s[0], &p));
  ASSERT_OK(det::access(d, p, 8, w.s[1], "early reader"));  // s[1] never waited for s[0]
  det::run(d);
  const std::string v = joined(w.violations());
  EXPECT_TRUE(v.find("not ordered after the allocation") != std::string::npos ||
              v.find("ran before the allocation") != std::string::npos)
      << v;
  ASSERT_OK(d.pool_free(p, 256, w.s[1]));
  det::run(d);
}

/// A pool free of a block freed already, or of an address no block starts at (an over-aligned
/// allocation's data pointer), is reported: cudaFreeAsync refuses such a pointer, and a double
/// free into a real pool lets two later allocations overlap, which this driver, never reusing a
/// block, could not show. Both were ignored.
TEST(Deterministic, AFreeOfNoLiveBlockIsReported) {
  world w(9);
  detail::driver& d = w.drv();
  void* p = nullptr;
  ASSERT_OK(d.pool_allocate(4096, w.s[0], &p));
  ASSERT_OK(d.pool_free(static_cast<char*>(p) + 512, 4096, w.s[0]));  // inside, not its start
  ASSERT_OK(d.pool_free(p, 4096, w.s[0]));
  ASSERT_OK(d.pool_free(p, 4096, w.s[0]));  // again
  det::run(d);
  const std::string v = joined(w.violations());
  EXPECT_NE(std::string::npos, v.find("no block arcpool holds starts there")) << v;
  EXPECT_NE(std::string::npos, v.find("the block was freed already (pool free on")) << v;
}

/// The stream caches tell the checker where a block leaves and re-enters use
/// (driver::note_release and note_acquire): a use the program never told arcpool about is
/// reported at the cache's release itself, and a cache hit is a new allocation of the block.
TEST(Deterministic, TheCachesReleasesAndHitsAreCheckedWhereTheyHappen) {
  world w(7, size_t{1} << 20);
  detail::driver& d = w.drv();
  arcpool_allocation_t* a = nullptr;
  ASSERT_OK(arcpool_allocate_async(w.alloc, 4096, 0, w.s[0], 0, &a));
  void* const p = w.data(a);
  ASSERT_OK(det::wait_stream(d, w.s[1], w.s[0]));
  ASSERT_OK(det::access(d, p, 8, w.s[1], "unrecorded reader"));  // no record_use: wrong
  ASSERT_OK(arcpool_deallocate_async(a, w.s[0], 0));             // into s[0]'s cache
  arcpool_allocation_release(a);
  det::run(d);
  std::string v = joined(w.violations());
  EXPECT_NE(std::string::npos, v.find("cache release")) << v;
  EXPECT_NE(std::string::npos, v.find("unrecorded reader")) << v;

  arcpool_allocation_t* again = nullptr;
  ASSERT_OK(arcpool_allocate_async(w.alloc, 4096, 0, w.s[0], 0, &again));
  ASSERT_EQ(p, w.data(again)) << "not a cache hit";
  ASSERT_OK(det::access(d, p, 8, w.s[0], "reader after the hit"));
  det::run(d);
  v = joined(w.violations());
  EXPECT_EQ(std::string::npos, v.find("reader after the hit")) << v;
  ASSERT_OK(arcpool_deallocate_async(again, w.s[0], 0));
  arcpool_allocation_release(again);
  w.finish();
}

}  // namespace
}  // namespace arcpool::test
