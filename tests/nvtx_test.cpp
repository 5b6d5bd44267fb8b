// The NVTX ranges arrive at a tool: this test runs with NVTX_INJECTION64_PATH naming
// tests/nvtx_injection.cpp's library, which counts the ranges of the "arcpool" domain.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "support/driver_test.hpp"

namespace arcpool::test {
namespace {

/// A function of the injected tool.
template <class F>
F tool_function(const char* name) {
  const char* path = std::getenv("NVTX_INJECTION64_PATH");
  if (path == nullptr) return nullptr;
  void* library = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
  return library == nullptr ? nullptr : reinterpret_cast<F>(dlsym(library, name));
}

TEST(Nvtx, EveryPublicOperationOpensARangeInTheArcpoolDomain) {
  if (std::getenv("NVTX_INJECTION64_PATH") == nullptr) {
    GTEST_SKIP() << "run through CTest: NVTX_INJECTION64_PATH must name the test tool";
  }
  arcpool_allocator_options_t options;
  arcpool_allocator_options_init(&options);
  options.driver = ARCPOOL_DRIVER_HOST;
  arcpool_allocator_t* alloc = nullptr;
  ASSERT_OK(arcpool_allocator_create(&options, &alloc));
  arcpool_stream_t a = nullptr;
  arcpool_stream_t b = nullptr;
  ASSERT_OK(arcpool_stream_create(alloc, &a));
  ASSERT_OK(arcpool_stream_create(alloc, &b));

  // NVTX loads the tool at arcpool's first range, in the first operation below.
  arcpool_allocation_t* h = nullptr;
  ASSERT_OK(arcpool_allocate_async(alloc, 12345, 0, a, 0, &h));  // 1
  ASSERT_OK(arcpool_allocation_preserve(h));                     // 2
  ASSERT_OK(arcpool_allocation_discard(h, nullptr));             // 3
  ASSERT_OK(arcpool_record_use(h, b));                           // 4
  ASSERT_OK(arcpool_transfer(h, b));                             // 5
  ASSERT_OK(arcpool_deallocate_async(h, b, 0));                  // 6
  arcpool_allocation_release(h);
  ASSERT_OK(arcpool_allocator_trim(alloc, 0));  // 7

  auto pushes = tool_function<int (*)()>("arcpool_test_nvtx_pushes");
  auto pops = tool_function<int (*)()>("arcpool_test_nvtx_pops");
  auto categories = tool_function<int (*)()>("arcpool_test_nvtx_categories");
  auto find = tool_function<int (*)(const char*)>("arcpool_test_nvtx_find");
  ASSERT_NE(nullptr, pushes) << "the NVTX tool was not loaded";
  ASSERT_NE(nullptr, find);
  EXPECT_EQ(7, pushes());
  EXPECT_EQ(pushes(), pops()) << "every range is closed";
  EXPECT_EQ(9, categories()) << "one category per kind of operation";
  EXPECT_EQ(1, find(":12345:allocate 12345 B stream")) << "size in the payload and message";
  EXPECT_EQ(1, find("transfer 12345 B stream"));
  EXPECT_EQ(1, find("record_use"));
  EXPECT_EQ(1, find("deallocate"));

  ASSERT_OK(arcpool_stream_destroy(alloc, a));
  ASSERT_OK(arcpool_stream_destroy(alloc, b));
  arcpool_allocator_destroy(alloc);
}

/// A host allocator with one created stream, and the same-stream pair on it: the first call
/// fills the stream's cache, every later one is a cache hit.
class HitsOnAStream : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::getenv("NVTX_INJECTION64_PATH") == nullptr) {
      GTEST_SKIP() << "run through CTest: NVTX_INJECTION64_PATH must name the test tool";
    }
    arcpool_allocator_options_t options;
    arcpool_allocator_options_init(&options);
    options.driver = ARCPOOL_DRIVER_HOST;
    ASSERT_OK(arcpool_allocator_create(&options, &alloc_));
    ASSERT_OK(arcpool_stream_create(alloc_, &s_));
  }
  void TearDown() override {
    if (s_ != nullptr) {
      EXPECT_OK(arcpool_stream_destroy(alloc_, s_));
    }
    if (alloc_ != nullptr) arcpool_allocator_destroy(alloc_);
  }
  void pair() {
    arcpool_allocation_t* h = nullptr;
    ASSERT_OK(arcpool_allocate_async(alloc_, 4096, 0, s_, 0, &h));
    ASSERT_OK(arcpool_deallocate_async(h, s_, 0));
    arcpool_allocation_release(h);
  }
  uint64_t cache_hits() const {
    arcpool_stats_t st{};
    st.struct_size = sizeof(st);
    st.version = ARCPOOL_STATS_VERSION;
    EXPECT_OK(arcpool_stats_get(alloc_, &st));
    return st.cache_hits;
  }

  arcpool_allocator_t* alloc_ = nullptr;
  arcpool_stream_t s_ = nullptr;
};

TEST_F(HitsOnAStream, ACacheHitStillOpensItsRange) {
  pair();  // loads the tool if no range did yet; fills the stream's cache
  auto pushes = tool_function<int (*)()>("arcpool_test_nvtx_pushes");
  ASSERT_NE(nullptr, pushes) << "the NVTX tool was not loaded";
  const int before = pushes();
  pair();  // a cache hit and a same-stream free
  EXPECT_EQ(1u, cache_hits());
  EXPECT_EQ(before + 2, pushes()) << "the cache hit and its free each open a range";
}

TEST_F(HitsOnAStream, ACacheHitStillNamesItsMemoryRegion) {
  // With a tool attached the fast path stays closed (allocator::fast_path_open): the hit is
  // served by the general path, which names the allocation's region for the tool.
  pair();
  auto regions = tool_function<int (*)()>("arcpool_test_nvtx_regions");
  ASSERT_NE(nullptr, regions) << "the NVTX tool was not loaded";
  ASSERT_GE(regions(), 1) << "the first allocation named no region";
  const int before = regions();
  pair();  // a cache hit
  EXPECT_EQ(1u, cache_hits());
  EXPECT_EQ(before + 1, regions()) << "the cache hit named no region";
}

// An import's memory is not arcpool's to name: its free unregisters no region (it unregistered
// the region of the memory's own allocation, which another allocator, or arcpool, had named).
TEST_F(HitsOnAStream, AnImportsFreeUnregistersNoRegion) {
  pair();
  auto live = tool_function<int (*)()>("arcpool_test_nvtx_live_regions");
  auto unknown = tool_function<int (*)()>("arcpool_test_nvtx_unknown_unregisters");
  ASSERT_NE(nullptr, live) << "the NVTX tool was not loaded";
  ASSERT_NE(nullptr, unknown);
  arcpool_allocation_t* mine = nullptr;
  ASSERT_OK(arcpool_allocate_async(alloc_, 4096, 0, s_, 0, &mine));
  void* p = nullptr;
  ASSERT_OK(arcpool_allocation_data(mine, &p));
  const int live_before = live();
  const int unknown_before = unknown();
  arcpool_allocation_t* imported = nullptr;
  ASSERT_OK(arcpool_import(alloc_, p, 4096, s_, 0, nullptr, nullptr, &imported));
  ASSERT_OK(arcpool_deallocate_async(imported, s_, 0));
  arcpool_allocation_release(imported);
  EXPECT_EQ(live_before, live()) << "the import's free unregistered its memory's region";
  EXPECT_EQ(unknown_before, unknown());
  ASSERT_OK(arcpool_deallocate_async(mine, s_, 0));
  arcpool_allocation_release(mine);
  EXPECT_EQ(live_before - 1, live()) << "the allocation's free unregistered no region";
  EXPECT_EQ(unknown_before, unknown());
}

}  // namespace
}  // namespace arcpool::test
