// Devices and contexts (design.md §6, issue 13): every call of an allocator acts in its
// device's primary context and leaves the calling thread's context as it found it, none
// included; a failed switch is an error; a stream of another device is refused, naming both.
// The CUDA driver with two devices: simcuda (SIMCUDA_DEVICES, default 2) in CI, or a machine
// with two GPUs. The tests that count contexts or inject faults need simcuda.
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "arcpool/arcpool.h"
#include "support/driver_entry_point.hpp"
#include "support/driver_test.hpp"
#include "support/simcuda_probe.hpp"

namespace arcpool::test {
namespace {

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

/// Skips unless the CUDA driver runs with two devices (fails without a GPU when one is
/// required, as every CUDA test).
#define ARCPOOL_REQUIRE_TWO_DEVICES_OR_SKIP()                                    \
  do {                                                                           \
    ARCPOOL_REQUIRE_CUDA_OR_SKIP();                                              \
    if (device_count() < 2) GTEST_SKIP() << "needs two CUDA devices (one here)"; \
  } while (0)

arcpool_allocator_t* cuda_allocator(int device) {
  arcpool_allocator_options_t options;
  arcpool_allocator_options_init(&options);
  options.driver = ARCPOOL_DRIVER_CUDA;
  options.device = device;
  arcpool_allocator_t* a = nullptr;
  EXPECT_OK(arcpool_allocator_create(&options, &a));
  return a;
}

/// Creates a stream, allocates, frees on another stream (deferred), synchronizes and tears
/// down: every kind of driver call, on `device`'s allocator.
void exercise(int device) {
  arcpool_allocator_t* alloc = cuda_allocator(device);
  ASSERT_NE(nullptr, alloc);
  arcpool_stream_t s = nullptr, t = nullptr;
  ASSERT_OK(arcpool_stream_create(alloc, &s));
  ASSERT_OK(arcpool_stream_create(alloc, &t));
  arcpool_allocation_t* a = nullptr;
  ASSERT_OK(arcpool_allocate_async(alloc, size_t{1} << 20, 0, s, 0, &a));
  ASSERT_OK(arcpool_transfer(a, t));
  ASSERT_OK(arcpool_deallocate_async(a, s, ARCPOOL_DEALLOCATE_FLAG_DEFERRED));
  arcpool_allocation_release(a);
  ASSERT_OK(arcpool_stream_synchronize(alloc, s));
  ASSERT_OK(arcpool_stream_synchronize(alloc, t));
  ASSERT_OK(arcpool_allocator_trim(alloc, 0));
  ASSERT_OK(arcpool_stream_destroy(alloc, s));
  ASSERT_OK(arcpool_stream_destroy(alloc, t));
  arcpool_allocator_destroy(alloc);
}

/// The child of NeverTouchedDevicesGetNoContext: a fresh process whose only CUDA work is
/// device 1's allocator, from a thread that never chose a device. Exits 0 when device 0 got
/// no context and the thread still has none.
[[noreturn]] void use_device_one_only() {
  exercise(1);
  const bool none_current = current_context() == nullptr;
  const uint64_t zero = simcuda_primary_contexts(0), one = simcuda_primary_contexts(1);
  std::fprintf(stderr, "contexts: device 0 %llu, device 1 %llu; none current: %d\n",
               static_cast<unsigned long long>(zero), static_cast<unsigned long long>(one),
               none_current);
  std::exit(zero == 0 && one == 1 && none_current && !::testing::Test::HasFailure() ? 0 : 1);
}

TEST(Devices, NeverTouchedDevicesGetNoContext) {
  ARCPOOL_REQUIRE_TWO_DEVICES_OR_SKIP();
  if (!on_simcuda()) GTEST_SKIP() << "counts primary contexts with simcuda's counter";
  // "threadsafe" runs the child as a fresh execution of this test binary: no earlier test has
  // touched a device there.
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(use_device_one_only(), ::testing::ExitedWithCode(0),
              "contexts: device 0 0, device 1 1; none current: 1");
}

/// The child of AnUnreadApplicationErrorOutlivesArcpoolsFirstCalls: a fresh process whose
/// application leaves an error unread (a device that does not exist), then makes arcpool's first
/// CUDA calls: an allocator, a stream, a same-stream pair. Exits 0 when the application's error
/// is still the thread's last error.
[[noreturn]] void leave_an_error_then_use_arcpool() {
  const bool left = cudaSetDevice(-1) == cudaErrorInvalidDevice;
  if (arcpool_allocator_t* alloc = cuda_allocator(0); alloc != nullptr) {
    arcpool_stream_t s = nullptr;
    EXPECT_OK(arcpool_stream_create(alloc, &s));
    arcpool_allocation_t* a = nullptr;
    EXPECT_OK(arcpool_allocate_async(alloc, size_t{1} << 20, 0, s, 0, &a));
    EXPECT_OK(arcpool_deallocate_async(a, s, 0));
    arcpool_allocation_release(a);
    EXPECT_OK(arcpool_stream_destroy(alloc, s));
    arcpool_allocator_destroy(alloc);
  }
  const cudaError_t pending = cudaGetLastError();
  std::fprintf(stderr, "left: %d; pending after arcpool: %s\n", left, cudaGetErrorName(pending));
  std::exit(left && pending == cudaErrorInvalidDevice && !::testing::Test::HasFailure() ? 0 : 1);
}

TEST(Devices, AnUnreadApplicationErrorOutlivesArcpoolsFirstCalls) {
  ARCPOOL_REQUIRE_CUDA_OR_SKIP();
  // "cudaGetLastError: Returns the last error that has been produced by any of the runtime calls
  // in the same instance of the CUDA Runtime library in the host thread and resets it to
  // cudaSuccess" (CUDA Runtime API, Error Handling): arcpool clears only errors of its own
  // failed calls. The first calls of a process look up the driver's context functions; a fresh
  // process ("threadsafe" re-executes this test binary) is where that happens.
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(leave_an_error_then_use_arcpool(), ::testing::ExitedWithCode(0),
              "left: 1; pending after arcpool: cudaErrorInvalidDevice");
}

TEST(Devices, AutoNeverServesAMissingDeviceFromHostMemory) {
  ARCPOOL_REQUIRE_CUDA_OR_SKIP();
  if (std::getenv("ARCPOOL_DRIVER") != nullptr) GTEST_SKIP() << "ARCPOOL_DRIVER picks the driver";
  // AUTO falls back to the host driver on a machine without CUDA devices. Here there are some:
  // a device index beyond them is an error, never host memory that a framework would take for
  // device memory of that device.
  int count = 0;
  ASSERT_EQ(cudaSuccess, cudaGetDeviceCount(&count));
  const int missing = count;
  EXPECT_EQ(ARCPOOL_DRIVER_CUDA, arcpool_auto_driver(missing));
  arcpool_allocator_options_t options;
  arcpool_allocator_options_init(&options);
  options.device = missing;
  arcpool_allocator_t* alloc = nullptr;
  EXPECT_STATUS(ARCPOOL_STATUS_NO_DEVICE, arcpool_allocator_create(&options, &alloc));
  EXPECT_EQ(nullptr, alloc);
  EXPECT_STATUS(ARCPOOL_STATUS_NO_DEVICE, arcpool_default_allocator_get(missing, &alloc));
  EXPECT_EQ(nullptr, alloc);
  void* p = arcpool_malloc_async(4096, missing, nullptr);
  EXPECT_EQ(nullptr, p) << "device " << missing << " of " << count << " served";
  if (p != nullptr) arcpool_free_async(p, 4096, missing, nullptr);
}

TEST(Devices, EveryCallLeavesTheThreadOnItsOwnDevice) {
  ARCPOOL_REQUIRE_TWO_DEVICES_OR_SKIP();
  std::thread([] {
    ASSERT_EQ(cudaSuccess, cudaSetDevice(0));
    const CUcontext mine = current_context();
    ASSERT_NE(nullptr, mine);
    exercise(1);
    int device = -1;
    ASSERT_EQ(cudaSuccess, cudaGetDevice(&device));
    EXPECT_EQ(0, device) << "device 1's allocator left its device current";
    EXPECT_EQ(mine, current_context());
  }).join();
}

TEST(Devices, AThreadWithNoContextKeepsTheRuntimesDevice) {
  ARCPOOL_REQUIRE_TWO_DEVICES_OR_SKIP();
  // A thread that never chose a device works on device 0 when its first runtime call needs a
  // context. An allocator of device 1 used from it must leave it so: the runtime's own
  // per-thread device is set by cudaSetDevice, and popping the context does not put it back
  // (design.md §6). The guard switches with cuCtxSetCurrent alone.
  std::thread([] {
    ASSERT_EQ(nullptr, current_context());
    exercise(1);
    EXPECT_EQ(nullptr, current_context()) << "a context left current";
    int device = -1;
    ASSERT_EQ(cudaSuccess, cudaGetDevice(&device));
    EXPECT_EQ(0, device) << "device 1's allocator changed the runtime's device of this thread";
    ASSERT_EQ(cudaSuccess, cudaFree(nullptr));  // needs a context: the runtime picks one
    ASSERT_NE(nullptr, current_context());
    ASSERT_EQ(cudaSuccess, cudaGetDevice(&device));
    EXPECT_EQ(0, device) << "the thread's next runtime call went to device 1";
  }).join();
}

TEST(Devices, AnAllocatorGivesBackItsRetainOfThePrimaryContext) {
  ARCPOOL_REQUIRE_TWO_DEVICES_OR_SKIP();
  if (!on_simcuda()) GTEST_SKIP() << "counts retains with simcuda's counter";
  const uint64_t before = simcuda_primary_retains(1);
  arcpool_allocator_t* alloc = cuda_allocator(1);
  ASSERT_NE(nullptr, alloc);
  EXPECT_EQ(before + 1, simcuda_primary_retains(1));
  arcpool_allocator_destroy(alloc);
  EXPECT_EQ(before, simcuda_primary_retains(1));
}

TEST(Devices, AStreamOfAnotherContextOfTheDeviceIsRefused) {
  ARCPOOL_REQUIRE_CUDA_OR_SKIP();
  // arcpool's events live in the device's primary context, and cudaEventRecord's "event and
  // stream must be on the same CUDA context": a stream of a cuCtxCreate context would take an
  // allocation, then fail at its first fence. It is refused at its first use instead.
  using create_fn = CUresult(CUDAAPI*)(CUcontext*, CUctxCreateParams*, unsigned, CUdevice);
  using destroy_fn = CUresult(CUDAAPI*)(CUcontext);
  using set_fn = CUresult(CUDAAPI*)(CUcontext);
  const auto create = driver_function<create_fn>("cuCtxCreate", 13000);
  const auto destroy = driver_function<destroy_fn>("cuCtxDestroy");
  const auto set_current = driver_function<set_fn>("cuCtxSetCurrent");
  ASSERT_NE(nullptr, create);
  ASSERT_NE(nullptr, destroy);
  ASSERT_NE(nullptr, set_current);
  std::thread([&] {
    ASSERT_EQ(cudaSuccess, cudaSetDevice(0));
    const CUcontext primary = current_context();
    CUctxCreateParams params{};
    CUcontext other = nullptr;
    ASSERT_EQ(CUDA_SUCCESS, create(&other, &params, 0, 0));
    cudaStream_t foreign = nullptr;
    ASSERT_EQ(cudaSuccess, cudaStreamCreateWithFlags(&foreign, cudaStreamNonBlocking));
    ASSERT_EQ(CUDA_SUCCESS, set_current(primary));

    arcpool_allocator_t* alloc = cuda_allocator(0);
    ASSERT_NE(nullptr, alloc);
    arcpool_allocation_t* a = nullptr;
    EXPECT_STATUS(ARCPOOL_STATUS_INVALID_ARGUMENT,
                  arcpool_allocate_async(alloc, size_t{1} << 20, 0, foreign, 0, &a));
    EXPECT_NE(nullptr, std::strstr(arcpool_last_error(), "other than its primary context"))
        << arcpool_last_error();
    EXPECT_STATUS(ARCPOOL_STATUS_INVALID_ARGUMENT, arcpool_stream_register(alloc, foreign));
    EXPECT_EQ(cudaSuccess, cudaGetLastError()) << "arcpool's refusal is not the thread's error";
    EXPECT_EQ(primary, current_context());
    // The primary context's streams still serve.
    arcpool_stream_t s = nullptr;
    ASSERT_OK(arcpool_stream_create(alloc, &s));
    ASSERT_OK(arcpool_allocate_async(alloc, size_t{1} << 20, 0, s, 0, &a));
    ASSERT_OK(arcpool_deallocate_async(a, s, 0));
    arcpool_allocation_release(a);
    ASSERT_OK(arcpool_stream_destroy(alloc, s));
    arcpool_allocator_destroy(alloc);

    ASSERT_EQ(CUDA_SUCCESS, set_current(other));
    EXPECT_EQ(cudaSuccess, cudaStreamDestroy(foreign));
    EXPECT_EQ(CUDA_SUCCESS, destroy(other));
    EXPECT_EQ(cudaSuccess, cudaSetDevice(0));
  }).join();
}

TEST(Devices, ABorrowedPoolIsNeitherTrimmedNorItsPeakReset) {
  ARCPOOL_REQUIRE_CUDA_OR_SKIP();
  // The device's default pool is the application's: arcpool_allocator_trim trims "owned pools
  // only", and its high-water mark is the application's to reset.
  ASSERT_EQ(cudaSuccess, cudaSetDevice(0));
  cudaMemPool_t pool = nullptr;
  ASSERT_EQ(cudaSuccess, cudaDeviceGetDefaultMemPool(&pool, 0));
  uint64_t keep_all = UINT64_MAX;
  ASSERT_EQ(cudaSuccess, cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep_all));
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaSuccess, cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  void* p = nullptr;
  ASSERT_EQ(cudaSuccess, cudaMallocAsync(&p, size_t{8} << 20, s));
  ASSERT_EQ(cudaSuccess, cudaFreeAsync(p, s));
  ASSERT_EQ(cudaSuccess, cudaStreamSynchronize(s));
  auto attribute = [&](cudaMemPoolAttr a) {
    uint64_t v = 0;
    EXPECT_EQ(cudaSuccess, cudaMemPoolGetAttribute(pool, a, &v));
    return v;
  };
  const uint64_t reserved = attribute(cudaMemPoolAttrReservedMemCurrent);
  const uint64_t high = attribute(cudaMemPoolAttrReservedMemHigh);
  ASSERT_GE(reserved, uint64_t{8} << 20) << "the application's release threshold keeps it";

  arcpool_allocator_options_t options;
  arcpool_allocator_options_init(&options);
  options.driver = ARCPOOL_DRIVER_CUDA;
  options.pool_source = ARCPOOL_POOL_DEVICE_DEFAULT;
  arcpool_allocator_t* alloc = nullptr;
  ASSERT_OK(arcpool_allocator_create(&options, &alloc));
  EXPECT_OK(arcpool_allocator_trim(alloc, 0));
  EXPECT_OK(arcpool_stats_reset_peaks(alloc));
  EXPECT_EQ(reserved, attribute(cudaMemPoolAttrReservedMemCurrent)) << "arcpool trimmed it";
  EXPECT_EQ(high, attribute(cudaMemPoolAttrReservedMemHigh)) << "arcpool reset its peak";
  arcpool_allocator_destroy(alloc);

  uint64_t zero = 0;
  EXPECT_EQ(cudaSuccess, cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &zero));
  EXPECT_EQ(cudaSuccess, cudaMemPoolTrimTo(pool, 0));
  EXPECT_EQ(cudaSuccess, cudaStreamDestroy(s));
}

TEST(Devices, CallsWhoseFailureArcpoolIgnoresLeaveNoErrorAndNoModeBehind) {
  ARCPOOL_REQUIRE_CUDA_OR_SKIP();
  if (!on_simcuda()) GTEST_SKIP() << "injects the failures with simcuda_fail_next";
  // A failed destroy or mode exchange is arcpool's: the application's next cudaGetLastError()
  // must not report it, and a failed exchange must not leave the thread in another capture
  // mode (CUDA Runtime API, cudaGetLastError, cudaThreadExchangeStreamCaptureMode).
  std::thread([] {
    ASSERT_EQ(cudaSuccess, cudaSetDevice(0));
    arcpool_allocator_t* alloc = cuda_allocator(0);
    ASSERT_NE(nullptr, alloc);
    arcpool_stream_t s = nullptr;
    ASSERT_OK(arcpool_stream_create(alloc, &s));

    ASSERT_TRUE(simcuda_fail_next("cudaThreadExchangeStreamCaptureMode", cudaErrorUnknown));
    EXPECT_OK(arcpool_stream_synchronize(alloc, s));
    EXPECT_EQ(cudaSuccess, cudaGetLastError()) << "a failed exchange left its error";
    cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
    ASSERT_EQ(cudaSuccess, cudaThreadExchangeStreamCaptureMode(&mode));
    EXPECT_EQ(cudaStreamCaptureModeGlobal, mode) << "the thread was left in another mode";
    ASSERT_EQ(cudaSuccess, cudaThreadExchangeStreamCaptureMode(&mode));

    // The pool of an owned allocator is destroyed on the destroying thread.
    ASSERT_OK(arcpool_stream_destroy(alloc, s));
    ASSERT_TRUE(simcuda_fail_next("cudaMemPoolDestroy", cudaErrorInvalidValue));
    arcpool_allocator_destroy(alloc);
    EXPECT_EQ(cudaSuccess, cudaGetLastError()) << "a failed pool destroy left its error";
  }).join();
}

TEST(Devices, AFailedSwitchIsAnErrorAndNothingRunsOnTheWrongDevice) {
  ARCPOOL_REQUIRE_TWO_DEVICES_OR_SKIP();
  if (!on_simcuda()) GTEST_SKIP() << "injects the failure with simcuda_fail_next";
  std::thread([] {
    ASSERT_EQ(cudaSuccess, cudaSetDevice(0));
    arcpool_allocator_t* alloc = cuda_allocator(1);
    ASSERT_NE(nullptr, alloc);
    reset_simcuda_calls();
    ASSERT_TRUE(simcuda_fail_next("cuCtxSetCurrent", cudaErrorDevicesUnavailable));
    arcpool_stream_t s = nullptr;
    EXPECT_STATUS(ARCPOOL_STATUS_CUDA_ERROR, arcpool_stream_create(alloc, &s));
    EXPECT_NE(nullptr, std::strstr(arcpool_last_error(),
                                   "cannot switch to device 1: cuCtxSetCurrent failed"))
        << arcpool_last_error();
    EXPECT_EQ(0u, simcuda_calls("cudaStreamCreateWithFlags")) << "a stream made on device 0";
    EXPECT_EQ(cudaSuccess, cudaGetLastError()) << "arcpool's failure is not the thread's error";
    int device = -1;
    ASSERT_EQ(cudaSuccess, cudaGetDevice(&device));
    EXPECT_EQ(0, device);
    ASSERT_OK(arcpool_stream_create(alloc, &s)) << "the next call switches again";
    ASSERT_OK(arcpool_stream_destroy(alloc, s));
    arcpool_allocator_destroy(alloc);
  }).join();
}

// The before-free hook "may enqueue work on `stream`" (arcpool.h): it runs with the allocator's
// device current, whatever the freeing thread's, so that its work lands where the free does.
// On a thread of device 0, device 1's legacy default stream (NULL) was device 0's for the hook:
// its fill wrote device 1's pool memory from device 0, ordered with neither the uses nor the
// free. Each way a free reaches the hook: the fast path into a stream's cache, a free from
// another stream (free_block), and a deferred one (completed by the reclaim worker, or by the
// trim on this thread).
TEST(Devices, TheBeforeFreeHookRunsOnTheAllocatorsDevice) {
  ARCPOOL_REQUIRE_TWO_DEVICES_OR_SKIP();
  std::thread([] {
    ASSERT_EQ(cudaSuccess, cudaSetDevice(0));
    struct seen_devices {
      std::mutex mutex;
      std::vector<int> devices;
    } seen;
    arcpool_allocator_options_t options;
    arcpool_allocator_options_init(&options);
    options.driver = ARCPOOL_DRIVER_CUDA;
    options.device = 1;
    options.before_free_user_data = &seen;
    options.before_free = [](void* p, size_t bytes, arcpool_stream_t stream, void* user_data) {
      auto& record = *static_cast<seen_devices*>(user_data);
      int device = -1;
      EXPECT_EQ(cudaSuccess, cudaGetDevice(&device));
      EXPECT_EQ(cudaSuccess, cudaMemsetAsync(p, 0xdd, bytes, static_cast<cudaStream_t>(stream)));
      std::lock_guard<std::mutex> lock(record.mutex);
      record.devices.push_back(device);
    };
    arcpool_allocator_t* alloc = nullptr;
    ASSERT_OK(arcpool_allocator_create(&options, &alloc));
    arcpool_stream_t s = nullptr;
    ASSERT_OK(arcpool_stream_create(alloc, &s));
    const size_t bytes = size_t{1} << 16;
    struct free_case {
      arcpool_stream_t allocated_on;
      arcpool_stream_t freed_on;
      uint32_t flags;
    };
    const free_case cases[] = {
        {s, s, 0},                                             // into the stream's cache
        {nullptr, nullptr, 0},                                 // into the legacy stream's
        {s, nullptr, ARCPOOL_DEALLOCATE_FLAG_WAIT_AND_FREE},   // from another stream
        {nullptr, nullptr, ARCPOOL_DEALLOCATE_FLAG_DEFERRED},  // through the reclaimer
    };
    for (const free_case& c : cases) {
      arcpool_allocation_t* a = nullptr;
      ASSERT_OK(arcpool_allocate_async(alloc, bytes, 0, c.allocated_on, 0, &a));
      ASSERT_OK(arcpool_deallocate_async(a, c.freed_on, c.flags));
      arcpool_allocation_release(a);
    }
    ASSERT_OK(arcpool_allocator_trim(alloc, 0));  // completes the deferred free here
    {
      std::lock_guard<std::mutex> lock(seen.mutex);
      EXPECT_EQ(std::vector<int>(std::size(cases), 1), seen.devices)
          << "the devices current in the hook";
    }
    int device = -1;
    ASSERT_EQ(cudaSuccess, cudaGetDevice(&device));
    EXPECT_EQ(0, device) << "the hook's switch was left behind";
    ASSERT_OK(arcpool_stream_synchronize(alloc, s));
    ASSERT_OK(arcpool_stream_destroy(alloc, s));
    arcpool_allocator_destroy(alloc);
    EXPECT_EQ("", take_simcuda_violations());
  }).join();
}

TEST(Devices, AStreamOfAnotherDeviceIsRefusedNamingBoth) {
  ARCPOOL_REQUIRE_TWO_DEVICES_OR_SKIP();
  std::thread([] {
    ASSERT_EQ(cudaSuccess, cudaSetDevice(0));
    cudaStream_t foreign = nullptr;
    ASSERT_EQ(cudaSuccess, cudaStreamCreateWithFlags(&foreign, cudaStreamNonBlocking));
    arcpool_allocator_t* alloc = cuda_allocator(1);
    ASSERT_NE(nullptr, alloc);
    auto s = reinterpret_cast<arcpool_stream_t>(foreign);
    EXPECT_STATUS(ARCPOOL_STATUS_INVALID_ARGUMENT, arcpool_stream_register(alloc, s));
    EXPECT_NE(nullptr, std::strstr(arcpool_last_error(), "belongs to device 0"));
    EXPECT_NE(nullptr, std::strstr(arcpool_last_error(), "serves device 1"));
    arcpool_allocation_t* a = nullptr;
    EXPECT_STATUS(ARCPOOL_STATUS_INVALID_ARGUMENT,
                  arcpool_allocate_async(alloc, 4096, 0, s, 0, &a));
    EXPECT_EQ(nullptr, a);
    arcpool_stats_t st{};
    st.struct_size = sizeof(st);
    st.version = ARCPOOL_STATS_VERSION;
    ASSERT_OK(arcpool_stats_get(alloc, &st));
    EXPECT_EQ(0u, st.allocations);
    arcpool_allocator_destroy(alloc);
    ASSERT_EQ(cudaSuccess, cudaStreamDestroy(foreign));
  }).join();
}

/// Writes `bytes` at `p` from device 1, on a stream of its own, and waits for the write (so a
/// free after it follows the peer's work). The thread is left on device 1.
void write_on_device_one(void* p, size_t bytes) {
  EXPECT_EQ(cudaSuccess, cudaSetDevice(1));
  cudaStream_t peer = nullptr;
  EXPECT_EQ(cudaSuccess, cudaStreamCreateWithFlags(&peer, cudaStreamNonBlocking));
  EXPECT_EQ(cudaSuccess, cudaMemsetAsync(p, 0x5a, bytes, peer));
  EXPECT_EQ(cudaSuccess, cudaStreamSynchronize(peer));
  EXPECT_EQ(cudaSuccess, cudaStreamDestroy(peer));
}

/// Allocates on device 0's allocator (peers as given), then writes the memory from a stream
/// of device 1, ordered after the allocation; returns simcuda's violations.
std::string write_from_device_one(std::vector<int> peers) {
  std::string violations;
  std::thread([&] {
    arcpool_allocator_options_t options;
    arcpool_allocator_options_init(&options);
    options.driver = ARCPOOL_DRIVER_CUDA;
    options.peer_devices = peers.data();
    options.peer_device_count = peers.size();
    arcpool_allocator_t* alloc = nullptr;
    ASSERT_OK(arcpool_allocator_create(&options, &alloc));
    arcpool_stream_t s = nullptr;
    ASSERT_OK(arcpool_stream_create(alloc, &s));
    constexpr size_t kBytes = size_t{1} << 20;
    arcpool_allocation_t* a = nullptr;
    ASSERT_OK(arcpool_allocate_async(alloc, kBytes, 0, s, 0, &a));
    void* p = nullptr;
    ASSERT_OK(arcpool_allocation_data(a, &p));
    ASSERT_OK(arcpool_stream_synchronize(alloc, s));  // the peer's work follows the allocation
    write_on_device_one(p, kBytes);
    ASSERT_OK(arcpool_deallocate_async(a, s, 0));
    arcpool_allocation_release(a);
    ASSERT_OK(arcpool_stream_destroy(alloc, s));
    arcpool_allocator_destroy(alloc);
    violations = take_simcuda_violations();
  }).join();
  return violations;
}

TEST(Devices, APeerGrantedAccessMayUseThePoolsMemoryAndOnlyThen) {
  ARCPOOL_REQUIRE_TWO_DEVICES_OR_SKIP();
  if (!on_simcuda()) GTEST_SKIP() << "simcuda checks the access (one GPU cannot test peers)";
  EXPECT_EQ("", write_from_device_one({1}));
  EXPECT_NE(std::string::npos, write_from_device_one({}).find("device 1 has no access"))
      << "without peer_devices device 1 may not touch device 0's pool";
}

/// The child of ThePeerAccessEnvironmentGrantsReachableDevicesTheDefaultAllocatorsPools: a fresh
/// process (no default allocator yet) with ARCPOOL_PEER_ACCESS=1 or without it. Device 1 writes
/// memory of device 0's default allocator (the framework hooks' arcpool_malloc_async); prints
/// simcuda's violations and exits 0 when there were none.
[[noreturn]] void write_from_device_one_through_the_hooks(bool peer_access) {
  if (peer_access) {
    setenv("ARCPOOL_PEER_ACCESS", "1", 1);
  } else {
    unsetenv("ARCPOOL_PEER_ACCESS");
  }
  constexpr size_t kBytes = size_t{1} << 20;
  void* p = arcpool_malloc_async(kBytes, 0, nullptr);
  EXPECT_NE(nullptr, p) << arcpool_last_error();
  EXPECT_EQ(cudaSuccess, cudaSetDevice(0));
  EXPECT_EQ(cudaSuccess, cudaDeviceSynchronize());  // the peer's work follows the allocation
  write_on_device_one(p, kBytes);
  EXPECT_OK(arcpool_free_async(p, kBytes, 0, nullptr));
  const std::string violations = take_simcuda_violations();
  std::fprintf(stderr, "violations: %s\n", violations.empty() ? "none" : violations.c_str());
  std::exit(violations.empty() && !::testing::Test::HasFailure() ? 0 : 1);
}

TEST(Devices, ThePeerAccessEnvironmentGrantsReachableDevicesTheDefaultAllocatorsPools) {
  ARCPOOL_REQUIRE_TWO_DEVICES_OR_SKIP();
  if (!on_simcuda()) GTEST_SKIP() << "simcuda checks the access (one GPU cannot test peers)";
  // PyTorch enables peers with cudaDeviceEnablePeerAccess, and "cudaMallocAsync pools are
  // unaffected by cudaDeviceEnablePeerAccess" (PyTorch's PeerToPeerAccess.cpp): the hooks'
  // allocators grant it themselves under ARCPOOL_PEER_ACCESS=1. Fresh processes ("threadsafe"
  // death tests), whose default allocators the variable is read for.
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(write_from_device_one_through_the_hooks(true), ::testing::ExitedWithCode(0),
              "violations: none");
  EXPECT_EXIT(write_from_device_one_through_the_hooks(false), ::testing::ExitedWithCode(1),
              "device 1 has no access");
}

TEST(Devices, PeersThatCannotBeGrantedAreRefused) {
  ARCPOOL_REQUIRE_TWO_DEVICES_OR_SKIP();
  auto create = [](std::vector<int> peers, arcpool_pool_source_t source) {
    arcpool_allocator_options_t options;
    arcpool_allocator_options_init(&options);
    options.driver = ARCPOOL_DRIVER_CUDA;
    options.pool_source = source;
    options.peer_devices = peers.data();
    options.peer_device_count = peers.size();
    arcpool_allocator_t* alloc = nullptr;
    const arcpool_status_t status = arcpool_allocator_create(&options, &alloc);
    const std::string message = status == ARCPOOL_STATUS_SUCCESS ? "" : arcpool_last_error();
    arcpool_allocator_destroy(alloc);
    return std::make_pair(status, message);
  };
  auto [own, own_message] = create({0}, ARCPOOL_POOL_OWNED);
  EXPECT_EQ(ARCPOOL_STATUS_INVALID_ARGUMENT, own);
  EXPECT_NE(std::string::npos, own_message.find("the pool's own device")) << own_message;
  auto [none, none_message] = create({device_count()}, ARCPOOL_POOL_OWNED);
  EXPECT_EQ(ARCPOOL_STATUS_INVALID_ARGUMENT, none);
  EXPECT_NE(std::string::npos, none_message.find("not a device")) << none_message;
  auto [borrowed, borrowed_message] = create({1}, ARCPOOL_POOL_DEVICE_DEFAULT);
  EXPECT_EQ(ARCPOOL_STATUS_INVALID_ARGUMENT, borrowed);
  EXPECT_NE(std::string::npos, borrowed_message.find("owned pool")) << borrowed_message;
}

/// The devices the stress needs: ARCPOOL_STRESS_DEVICES (the simcuda ctest entry
/// devices_four_simcuda sets it with SIMCUDA_DEVICES=4, and then fewer devices fail), else 4.
int stress_devices() {
  const char* text = std::getenv("ARCPOOL_STRESS_DEVICES");
  return text != nullptr && *text != '\0' ? std::atoi(text) : 4;
}

/// One allocation moving between threads: its device's allocator and the handle.
struct handed_allocation {
  int device;
  arcpool_allocation_t* allocation;
};

// Sixteen threads on four devices: each allocates on a device it picks (seeded), from its own
// stream of that device, after moving itself to another device the way applications call
// cudaSetDevice; every call must leave the thread's device as it was. Half the allocations are
// handed to other threads, which transfer or free them on their own stream of the allocation's
// device. The operation sequence of each thread is reproducible from the seed; the
// interleaving is not. Under TSan on simcuda in CI (the devices_four_simcuda entry).
TEST(DevicesStress, SixteenThreadsMoveBetweenFourDevices) {
  ARCPOOL_REQUIRE_CUDA_OR_SKIP();
  const int devices = stress_devices();
  if (device_count() < devices) {
    if (std::getenv("ARCPOOL_STRESS_DEVICES") != nullptr) {
      FAIL() << "ARCPOOL_STRESS_DEVICES=" << devices << " but " << device_count() << " devices";
    }
    GTEST_SKIP() << "needs " << devices << " CUDA devices (SIMCUDA_DEVICES=4 on simcuda)";
  }
  constexpr int kThreads = 16;
  constexpr int kIterations = 300;
  const char* seed_text = std::getenv("ARCPOOL_TEST_SEED");
  const uint64_t seed = seed_text != nullptr ? std::strtoull(seed_text, nullptr, 10) : 7;
  std::printf("DevicesStress seed %llu (ARCPOOL_TEST_SEED)\n",
              static_cast<unsigned long long>(seed));
  std::vector<arcpool_allocator_t*> allocators(devices);
  for (int d = 0; d < devices; ++d) {
    arcpool_allocator_options_t options;
    arcpool_allocator_options_init(&options);
    options.driver = ARCPOOL_DRIVER_CUDA;
    options.device = d;
    options.foreign_stream_routing = ARCPOOL_ROUTING_DEFERRED;
    ASSERT_OK(arcpool_allocator_create(&options, &allocators[d]));
  }
  std::mutex handoff_mutex;
  std::vector<handed_allocation> handoff;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(seed * 1000003 + t);
      std::vector<arcpool_stream_t> mine(devices);
      for (int d = 0; d < devices; ++d) {
        if (arcpool_stream_create(allocators[d], &mine[d]) != ARCPOOL_STATUS_SUCCESS) {
          ++failures;
          return;
        }
      }
      auto expect_device = [&](int expected, const char* after) {
        int now = -1;
        if (cudaGetDevice(&now) != cudaSuccess || now != expected) {
          std::fprintf(stderr, "thread %d: device %d after %s, expected %d\n", t, now, after,
                       expected);
          ++failures;
        }
      };
      auto free_one = [&](const handed_allocation& h, int here) {
        const uint32_t flags = rng() % 2 == 0 ? ARCPOOL_DEALLOCATE_FLAG_DEFERRED : 0;
        if (rng() % 3 == 0 &&
            arcpool_transfer(h.allocation, mine[h.device]) != ARCPOOL_STATUS_SUCCESS) {
          ++failures;
        }
        if (arcpool_deallocate_async(h.allocation, mine[h.device], flags) !=
            ARCPOOL_STATUS_SUCCESS) {
          ++failures;
        }
        arcpool_allocation_release(h.allocation);
        expect_device(here, "a free");
      };
      std::vector<handed_allocation> kept;
      int here = 0;
      for (int i = 0; i < kIterations; ++i) {
        here = static_cast<int>(rng() % devices);
        if (cudaSetDevice(here) != cudaSuccess) ++failures;
        const int d = static_cast<int>(rng() % devices);
        const size_t bytes = size_t{256} << (rng() % 12);
        arcpool_allocation_t* a = nullptr;
        if (arcpool_allocate_async(allocators[d], bytes, 0, mine[d], 0, &a) !=
            ARCPOOL_STATUS_SUCCESS) {
          ++failures;
          continue;
        }
        expect_device(here, "an allocation");
        if (rng() % 2 == 0) {
          std::lock_guard<std::mutex> lock(handoff_mutex);
          handoff.push_back({d, a});
        } else {
          kept.push_back({d, a});
        }
        handed_allocation taken{-1, nullptr};
        {
          std::lock_guard<std::mutex> lock(handoff_mutex);
          if (!handoff.empty() && rng() % 2 == 0) {
            taken = handoff.back();
            handoff.pop_back();
          }
        }
        if (taken.allocation != nullptr) free_one(taken, here);
        if (kept.size() > 8) {
          free_one(kept.front(), here);
          kept.erase(kept.begin());
        }
      }
      for (const handed_allocation& h : kept)
        free_one(h, here);
      for (int d = 0; d < devices; ++d) {
        if (arcpool_stream_synchronize(allocators[d], mine[d]) != ARCPOOL_STATUS_SUCCESS ||
            arcpool_stream_destroy(allocators[d], mine[d]) != ARCPOOL_STATUS_SUCCESS) {
          ++failures;
        }
      }
    });
  }
  for (std::thread& t : threads)
    t.join();
  for (const handed_allocation& h : handoff) {
    EXPECT_OK(arcpool_deallocate_async(h.allocation, nullptr, 0));
    arcpool_allocation_release(h.allocation);
  }
  EXPECT_EQ(0, failures.load());
  for (int d = 0; d < devices; ++d) {
    ASSERT_OK(arcpool_allocator_trim(allocators[d], 0));
    arcpool_stats_t st{};
    st.struct_size = sizeof(st);
    st.version = ARCPOOL_STATS_VERSION;
    ASSERT_OK(arcpool_stats_get(allocators[d], &st));
    EXPECT_EQ(0u, st.bytes_in_use_current) << "device " << d;
    EXPECT_EQ(0u, st.bytes_held_current) << "device " << d;
    EXPECT_EQ(st.allocations, st.deallocations) << "device " << d;
    arcpool_allocator_destroy(allocators[d]);
  }
  EXPECT_EQ("", take_simcuda_violations());
}

}  // namespace
}  // namespace arcpool::test
