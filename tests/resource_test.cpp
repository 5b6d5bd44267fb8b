// arcpool as a CCCL memory resource (the concept is static_asserted in the header and here)
// and as a Thrust-style allocator, on both drivers.
#include <gtest/gtest.h>

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
