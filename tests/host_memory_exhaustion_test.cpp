// Bad input and faults (design.md §10): a by-pointer allocation whose entry cannot be recorded
// because the host has no memory left for the by-pointer table to grow. Nothing may be lost:
// the call fails with OUT_OF_MEMORY and a message, the memory it allocated goes back in stream
// order, and every allocation recorded before stays findable and freeable.
//
// Its own program: it replaces the nothrow array operator new, which only the by-pointer table's
// growth uses in arcpool, so that the test can make exactly one such allocation fail.
#include <gtest/gtest.h>

#include <atomic>
#include <new>
#include <string>
#include <vector>

#include "arcpool/arcpool.h"

namespace {
std::atomic<int> g_array_news_to_fail{0};
std::atomic<int> g_array_news_failed{0};
}  // namespace

/// Fails while the test asks for it; otherwise the default array new (so that delete[] matches).
void* operator new[](std::size_t bytes, const std::nothrow_t&) noexcept {
  int left = g_array_news_to_fail.load();
  while (left > 0 && !g_array_news_to_fail.compare_exchange_weak(left, left - 1)) {
  }
  if (left > 0) {
    g_array_news_failed.fetch_add(1);
    return nullptr;
  }
  try {
    return ::operator new[](bytes);
  } catch (...) {
    return nullptr;
  }
}

namespace {

constexpr size_t kBytes = 4096;

#define EXPECT_OK(call) EXPECT_EQ(ARCPOOL_STATUS_SUCCESS, (call)) << arcpool_last_error()

TEST(HostMemoryExhaustion, AByPointerAllocationThatCannotBeRecordedFailsAndLosesNothing) {
  arcpool_allocator_options_t options;
  arcpool_allocator_options_init(&options);
  options.driver = ARCPOOL_DRIVER_HOST;
  arcpool_allocator_t* alloc = nullptr;
  ASSERT_EQ(ARCPOOL_STATUS_SUCCESS, arcpool_allocator_create(&options, &alloc))
      << arcpool_last_error();
  arcpool_stream_t s = nullptr;
  ASSERT_EQ(ARCPOOL_STATUS_SUCCESS, arcpool_stream_create(alloc, &s)) << arcpool_last_error();

  std::vector<void*> recorded;
  for (int i = 0; i < 10; ++i) {
    void* p = nullptr;
    ASSERT_EQ(ARCPOOL_STATUS_SUCCESS, arcpool_allocator_malloc_async(alloc, kBytes, 0, s, &p))
        << arcpool_last_error();
    recorded.push_back(p);
  }
  // The table grows as it fills: allocate until its next growth fails.
  g_array_news_to_fail = 1;
  void* refused = reinterpret_cast<void*>(1);
  arcpool_status_t status = ARCPOOL_STATUS_SUCCESS;
  while (g_array_news_failed.load() == 0 && recorded.size() < 100000) {
    void* p = nullptr;
    status = arcpool_allocator_malloc_async(alloc, kBytes, 0, s, &p);
    if (status != ARCPOOL_STATUS_SUCCESS) {
      refused = p;
      break;
    }
    recorded.push_back(p);
  }
  g_array_news_to_fail = 0;
  ASSERT_EQ(1, g_array_news_failed.load()) << "the table never grew";
  EXPECT_EQ(ARCPOOL_STATUS_OUT_OF_MEMORY, status);
  EXPECT_NE(std::string::npos, std::string(arcpool_last_error()).find("no host memory"))
      << arcpool_last_error();
  EXPECT_EQ(nullptr, refused);

  // The refused allocation was freed; the recorded ones are all still live.
  EXPECT_OK(arcpool_stream_synchronize(alloc, s));
  arcpool_stats_t st;
  st.struct_size = sizeof(st);
  st.version = ARCPOOL_STATS_VERSION;
  EXPECT_OK(arcpool_stats_get(alloc, &st));
  EXPECT_EQ(recorded.size(), st.allocations_in_use_current);
  EXPECT_EQ(recorded.size() * kBytes, st.bytes_in_use_current);
  EXPECT_EQ(recorded.size() + 1, st.allocations);
  EXPECT_EQ(1u, st.deallocations);

  // The table grows now, and every allocation frees by its pointer.
  void* later = nullptr;
  EXPECT_OK(arcpool_allocator_malloc_async(alloc, kBytes, 0, s, &later));
  recorded.push_back(later);
  for (void* p : recorded)
    EXPECT_OK(arcpool_allocator_free_async(alloc, p, s));
  EXPECT_OK(arcpool_stream_synchronize(alloc, s));
  EXPECT_OK(arcpool_stats_get(alloc, &st));
  EXPECT_EQ(0u, st.allocations_in_use_current);
  EXPECT_EQ(0u, st.bytes_in_use_current);

  EXPECT_OK(arcpool_stream_destroy(alloc, s));
  arcpool_allocator_destroy(alloc);
}

}  // namespace
