// arcpool under RMM's own containers, through RMM's resource-ref API (issue 12): rmm::device_buffer
// and rmm::device_uvector allocate from arcpool::memory_resource. Compiled against the CCCL that
// librmm-cu13 ships (its include/rapids), never with the toolkit's on the include path.
//
// librmm.so (librmm-cu13 26.10) links the CUDA runtime statically: it imports no libcudart
// symbol, so RMM's own calls (rmm::detail::memcpy_async behind set_element_async, for one) reach
// the driver through its private runtime. They cannot reach simcuda (tried: that copy failed
// there with cudaErrorInsufficientDriver), and without a GPU they fail: the test runs on a GPU
// only (skipped otherwise, with the reason; ARCPOOL_REQUIRE_GPU=1 makes that a failure).
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <type_traits>

#include <rmm/device_buffer.hpp>
#include <rmm/device_uvector.hpp>
#include <rmm/resource_ref.hpp>

#include "arcpool/resource.hpp"

static_assert(std::is_constructible_v<rmm::device_async_resource_ref, arcpool::memory_resource&>,
              "RMM's device_async_resource_ref takes arcpool::memory_resource");

namespace {

/// Why the test cannot run here ("" when it can).
std::string why_not_here() {
  if (dlsym(RTLD_DEFAULT, "simcuda_violation_count") != nullptr) {
    return "on simcuda: librmm.so carries its own static CUDA runtime, which simcuda cannot "
           "replace";
  }
  int devices = 0;
  if (const cudaError_t e = cudaGetDeviceCount(&devices); e != cudaSuccess) {
    return std::string("no CUDA device (") + cudaGetErrorName(e) + ")";
  }
  return devices > 0 ? "" : "no CUDA device";
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
}

}  // namespace
