// The benchmarks' shared defaults measure what their rows say (issue 9, bug 8): a "cache off"
// allocator has its per-stream cache off, and a "cache on" one has it on.
#include <gtest/gtest.h>

#include "bench_defaults.hpp"

namespace arcpool::test {
namespace {

/// Cache hits of a same-stream allocate, free, allocate of one size on an allocator from
/// bench::make_allocator(host, cache).
uint64_t cache_hits_of_a_same_stream_reuse(bool cache) {
  arcpool_allocator_t* a = bench::make_allocator(ARCPOOL_DRIVER_HOST, cache);
  arcpool_stream_t s = nullptr;
  EXPECT_EQ(ARCPOOL_STATUS_SUCCESS, arcpool_stream_create(a, &s));
  for (int i = 0; i < 2; ++i) {
    arcpool_allocation_t* h = nullptr;
    EXPECT_EQ(ARCPOOL_STATUS_SUCCESS, arcpool_allocate_async(a, 4096, 0, s, 0, &h));
    EXPECT_EQ(ARCPOOL_STATUS_SUCCESS, arcpool_deallocate_async(h, s, 0));
    arcpool_allocation_release(h);
  }
  arcpool_stats_t st{};
  st.struct_size = sizeof(st);
  st.version = ARCPOOL_STATS_VERSION;
  EXPECT_EQ(ARCPOOL_STATUS_SUCCESS, arcpool_stats_get(a, &st));
  EXPECT_EQ(ARCPOOL_STATUS_SUCCESS, arcpool_stream_destroy(a, s));
  arcpool_allocator_destroy(a);
  return st.cache_hits;
}

TEST(BenchDefaults, ACacheOffAllocatorHasNoCache) {
  EXPECT_EQ(0u, cache_hits_of_a_same_stream_reuse(false))
      << "make_allocator ignored cache=false: the benchmarks' cache-off rows ran cached";
}

TEST(BenchDefaults, ACacheOnAllocatorReusesFromTheCache) {
  EXPECT_EQ(1u, cache_hits_of_a_same_stream_reuse(true));
}

}  // namespace
}  // namespace arcpool::test
