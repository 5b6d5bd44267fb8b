// arcpool as a CCCL memory resource (the concept is static_asserted in the header and here)
// and as a Thrust-style allocator, on both drivers.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <type_traits>

#include "arcpool/resource.hpp"
#include "support/driver_test.hpp"

namespace arcpool::test {
namespace {

static_assert(::cuda::mr::async_resource<memory_resource>);
static_assert(::cuda::mr::resource<memory_resource>);
static_assert(::cuda::mr::async_resource_with<memory_resource, ::cuda::mr::device_accessible>);
static_assert(
    std::is_nothrow_invocable_v<decltype(&memory_resource::deallocate_async), memory_resource&,
                                void*, size_t, size_t, ::cuda::stream_ref>,
    "deallocation is noexcept");

class Resource : public DriverTest {};

TEST_P(Resource, AsyncAllocationsAreStreamOrderedAndAligned) {
  arcpool_stream_t s = make_stream();
  memory_resource mr(alloc_);
  ::cuda::mr::async_resource_ref<::cuda::mr::device_accessible> ref(mr);
  const ::cuda::stream_ref stream(reinterpret_cast<cudaStream_t>(s));
  void* p = ref.allocate_async(1000, 4096, stream);
  ASSERT_NE(nullptr, p);
  EXPECT_EQ(0u, reinterpret_cast<uintptr_t>(p) % 4096) << "alignment honoured";
  fill_async(s, p, 1000, 0x42);
  ref.deallocate_async(p, 1000, 4096, stream);
  sync(s);
  EXPECT_EQ(1u, stats().frees);
}

TEST_P(Resource, SynchronousFormsWork) {
  memory_resource mr(alloc_);
  void* p = mr.allocate(256, 256);
  ASSERT_NE(nullptr, p);
  mr.deallocate(p, 256, 256);
  EXPECT_EQ(1u, stats().deallocations);
  EXPECT_TRUE(mr == memory_resource(alloc_));
}

// The stream-first members of newer CCCL's resource concept (RMM 26.x builds against them;
// tests/rmm) forward to the same allocator calls.
TEST_P(Resource, TheStreamFirstFormsOfNewerCcclAllocateAndFreeInStreamOrder) {
  arcpool_stream_t s = make_stream();
  memory_resource mr(alloc_);
  const ::cuda::stream_ref stream(reinterpret_cast<cudaStream_t>(s));
  void* p = mr.allocate(stream, 1000, 4096);
  ASSERT_NE(nullptr, p);
  EXPECT_EQ(0u, reinterpret_cast<uintptr_t>(p) % 4096) << "alignment honoured";
  fill_async(s, p, 1000, 0x17);
  mr.deallocate(stream, p, 1000, 4096);
  sync(s);
  void* q = mr.allocate_sync(256, 256);
  ASSERT_NE(nullptr, q);
  mr.deallocate_sync(q, 256, 256);
  const arcpool_stats_t st = stats();
  EXPECT_EQ(2u, st.allocations);
  EXPECT_EQ(2u, st.deallocations);
  EXPECT_EQ(0u, st.bytes_in_use_current);
}

// The deallocations are noexcept: a free arcpool refuses is written to stderr, as the PyTorch
// and RMM drop-ins write theirs. It was dropped without a word (a double free here; a free
// refused during a capture leaked the memory unseen).
TEST_P(Resource, AFreeArcpoolRefusesIsReportedOnStderr) {
  arcpool_stream_t s = make_stream();
  memory_resource mr(alloc_);
  thrust_allocator thrust(alloc_, s);
  const ::cuda::stream_ref stream(reinterpret_cast<cudaStream_t>(s));
  void* p = mr.allocate_async(1000, 256, stream);
  char* q = thrust.allocate(1000);
  mr.deallocate_async(p, 1000, 256, stream);
  thrust.deallocate(q, 1000);
  testing::internal::CaptureStderr();  // no ASSERT until it is read back
  mr.deallocate_async(p, 1000, 256, stream);
  thrust.deallocate(q, 1000);
  const std::string reported = testing::internal::GetCapturedStderr();
  for (const void* freed : {static_cast<const void*>(p), static_cast<const void*>(q)}) {
    char free_of[64];
    std::snprintf(free_of, sizeof free_of, "arcpool: free of %p failed: ", freed);
    EXPECT_NE(std::string::npos, reported.find(free_of)) << reported;
  }
  EXPECT_NE(std::string::npos, reported.find("ARCPOOL_STATUS_UNKNOWN_POINTER")) << reported;
  sync(s);
}

TEST_P(Resource, OutOfMemoryIsABadAlloc) {
  memory_resource mr(alloc_);
  const ::cuda::stream_ref stream(reinterpret_cast<cudaStream_t>(make_stream()));
  EXPECT_THROW(mr.allocate_async(size_t{1} << 50, 256, stream), std::bad_alloc);
}

TEST_P(Resource, AThrustAllocatorAllocatesOnItsStream) {
  arcpool_stream_t s = make_stream();
  thrust_allocator a(alloc_, s);
  char* p = a.allocate(4096);
  ASSERT_NE(nullptr, p);
  EXPECT_EQ(1u, stats().allocations);
  a.deallocate(p, 4096);
  sync(s);
  EXPECT_EQ(1u, stats().same_stream_frees) << "freed on the stream it was allocated on";
}

ARCPOOL_INSTANTIATE_FOR_DRIVERS(Resource);

}  // namespace
}  // namespace arcpool::test
