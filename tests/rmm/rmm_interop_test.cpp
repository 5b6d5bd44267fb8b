// arcpool under RMM's own containers, through RMM's resource-ref API (issue 12): rmm::device_buffer
// and rmm::device_uvector allocate from arcpool::memory_resource. Built twice (tests/rmm), each
// time against the CCCL that RMM ships, never with the toolkit's on the include path:
// - arcpool_rmm_tests, RMM 26.10 (librmm-cu13). librmm.so links the CUDA runtime statically (it
//   imports no libcudart symbol), so RMM's own calls (rmm::detail::memcpy_async behind
//   set_element_async, for one) reach the driver through its private runtime. They cannot reach
//   simcuda (tried: that copy failed there with cudaErrorInsufficientDriver): that build runs on
//   a GPU only (ARCPOOL_RMM_STATIC_RUNTIME).
// - arcpool_rmm_header_only_tests, RMM 24.12 (librmm-cu12), the last header-only RMM: its
//   containers call this program's CUDA runtime, so it runs on a GPU and on simcuda, which
//   checks that RMM's copies on the streams are ordered after arcpool's allocations and before
//   its frees.
// Without a device the tests skip, with the reason; ARCPOOL_REQUIRE_GPU=1 makes that a failure.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <type_traits>

#include <rmm/device_buffer.hpp>
#include <rmm/device_uvector.hpp>
#include <rmm/resource_ref.hpp>

#include "arcpool/resource.hpp"
#include "support/simcuda_probe.hpp"

static_assert(std::is_constructible_v<rmm::device_async_resource_ref, arcpool::memory_resource&>,
              "RMM's device_async_resource_ref takes arcpool::memory_resource");

namespace {

/// Why the test cannot run here ("" when it can).
std::string why_not_here() {
#ifdef ARCPOOL_RMM_STATIC_RUNTIME
  if (arcpool::test::on_simcuda()) {
    return "on simcuda: librmm.so carries its own static CUDA runtime, which simcuda cannot "
           "replace";
  }
#endif
  int devices = 0;
  if (const cudaError_t e = cudaGetDeviceCount(&devices); e != cudaSuccess) {
    return std::string("no CUDA device (") + cudaGetErrorName(e) + ")";
  }
  return devices > 0 ? "" : "no CUDA device";
}

/// Holds `stream` for 100 ms: the work queued after it is still queued for that long.
void hold(cudaStream_t stream) {
  auto sleep = [](void*) { std::this_thread::sleep_for(std::chrono::milliseconds(100)); };
  ASSERT_EQ(cudaSuccess, cudaLaunchHostFunc(stream, sleep, nullptr));
}

#define REQUIRE_GPU_OR_SKIP()                                    \
  do {                                                           \
    if (const std::string why = why_not_here(); !why.empty()) {  \
      const char* required = std::getenv("ARCPOOL_REQUIRE_GPU"); \
      if (required != nullptr && std::string(required) == "1")   \
        FAIL() << "ARCPOOL_REQUIRE_GPU=1 but " << why;           \
      GTEST_SKIP() << why;                                       \
    }                                                            \
  } while (0)

TEST(RmmInterop, DeviceBufferAndUvectorAllocateThroughArcpool) {
  REQUIRE_GPU_OR_SKIP();
  arcpool::allocator alloc;
  arcpool::stream s = alloc.create_stream();
  arcpool::memory_resource mr(alloc.get());
  rmm::device_async_resource_ref ref(mr);
  const ::cuda::stream_ref view(reinterpret_cast<cudaStream_t>(s.get()));
  constexpr size_t kBuffer = size_t{1} << 20;
  {
    rmm::device_buffer buffer(kBuffer, view, ref);
    ASSERT_NE(nullptr, buffer.data());
    EXPECT_EQ(kBuffer, alloc.stats().bytes_in_use_current);
    rmm::device_uvector<int> v(1000, view, ref);
    const int value = 42;  // must live until the copy ran: element() synchronizes the stream
    v.set_element_async(7, value, view);
    EXPECT_EQ(42, v.element(7, view));
    EXPECT_EQ(kBuffer + 1000 * sizeof(int), alloc.stats().bytes_in_use_current);
    v.resize(2000, view);  // a new allocation, the old one freed on the stream
    EXPECT_EQ(42, v.element(7, view)) << "resize copies the contents";
  }
  s.synchronize();
  const arcpool_stats_t st = alloc.stats();
  EXPECT_EQ(0u, st.bytes_in_use_current);
  EXPECT_EQ(3u, st.allocations);
  EXPECT_EQ(3u, st.deallocations);
  EXPECT_EQ("", arcpool::test::take_simcuda_violations());
}

TEST(RmmInterop, AUvectorMovedToAnotherStreamIsFreedAfterItsWorkThere) {
  // RMM frees a container on the stream it was last set to: arcpool routes that free of memory
  // allocated on another stream, after the work queued where it was freed.
  REQUIRE_GPU_OR_SKIP();
  arcpool::allocator alloc;
  arcpool::stream first = alloc.create_stream();
  arcpool::stream second = alloc.create_stream();
  arcpool::memory_resource mr(alloc.get());
  rmm::device_async_resource_ref ref(mr);
  const ::cuda::stream_ref on_first(reinterpret_cast<cudaStream_t>(first.get()));
  const ::cuda::stream_ref on_second(reinterpret_cast<cudaStream_t>(second.get()));
  const int value = 7;  // lives until both streams are synchronized
  {
    rmm::device_uvector<int> v(1 << 16, on_first, ref);
    v.set_element_async(100, value, on_first);
    first.synchronize();
    v.set_stream(on_second);
    EXPECT_EQ(7, v.element(100, on_second));
    hold(on_second.get());
    v.set_element_async(200, value, on_second);  // still queued when v frees it
  }
  first.synchronize();
  second.synchronize();
  const arcpool_stats_t st = alloc.stats();
  EXPECT_EQ(0u, st.bytes_in_use_current);
  EXPECT_EQ(1u, st.allocations);
  EXPECT_EQ(1u, st.deallocations);
  EXPECT_EQ("", arcpool::test::take_simcuda_violations())
      << "the free ran before the write queued on the stream";
}

}  // namespace
