// The CUDA runtime calls each hot operation makes on the CUDA driver, counted by simcuda
// (docs/performance.md lists them with the reason each one stays). A call added to the fast
// path fails here. Runs on simcuda only: the real runtime has no call counters.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <string>

#include <cuda_runtime_api.h>

#include <thread>

#include "arcpool/arcpool.h"
#include "support/driver_test.hpp"
#include "support/process_exit.hpp"
#include "support/simcuda_probe.hpp"

namespace arcpool::test {
namespace {

/// The runtime functions the CUDA driver calls on its hot paths.
const char* const kFunctions[] = {"cuCtxGetCurrent",
                                  "cuCtxSetCurrent",
                                  "cudaGetDevice",
                                  "cudaSetDevice",
                                  "cudaStreamIsCapturing",
                                  "cudaStreamGetId",
                                  "cudaStreamGetDevice",
                                  "cuStreamGetCtx",
                                  "cudaEventRecord",
                                  "cudaStreamWaitEvent",
                                  "cudaEventCreateWithFlags",
                                  "cudaEventQuery",
                                  "cudaMallocFromPoolAsync",
                                  "cudaFreeAsync",
                                  "cudaStreamSynchronize",
                                  "cudaGetLastError",
                                  "cudaPeekAtLastError",
                                  "cudaThreadExchangeStreamCaptureMode"};

using call_counts = std::map<std::string, uint64_t>;

/// The calls `op` makes, by function (zero counts left out).
call_counts calls_of(const std::function<void()>& op) {
  reset_simcuda_calls();
  op();
  call_counts counts;
  for (const char* f : kFunctions) {
    if (const uint64_t n = simcuda_calls(f); n != 0) counts[f] = n;
  }
  return counts;
}

std::string describe(const call_counts& counts) {
  std::string text;
  for (const auto& [f, n] : counts)
    text += f + "=" + std::to_string(n) + " ";
  return text.empty() ? "(none)" : text;
}

/// A CUDA-driver allocator of device 0 with default options (null, with a failure, if none).
arcpool_allocator_t* cuda_allocator() {
  arcpool_allocator_options_t options;
  arcpool_allocator_options_init(&options);
  options.driver = ARCPOOL_DRIVER_CUDA;
  arcpool_allocator_t* alloc = nullptr;
  EXPECT_OK(arcpool_allocator_create(&options, &alloc));
  return alloc;
}

class RuntimeCalls : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!on_simcuda()) {
      GTEST_SKIP() << "counts CUDA runtime calls through simcuda's counters: run it on the "
                      "simcuda presets (tools/simcuda-test)";
    }
    // The thread works on the allocator's device, as an application that chose its device:
    // each device guard then finds the device's context current (OnAThreadWithNoContext
    // counts the other case).
    ASSERT_EQ(cudaSuccess, cudaSetDevice(0));
    alloc_ = cuda_allocator();
    ASSERT_NE(nullptr, alloc_);
    ASSERT_OK(arcpool_stream_create(alloc_, &s_));
    ASSERT_OK(arcpool_stream_create(alloc_, &t_));
    // Warm: the streams are in this thread's stream cache, a block of kBytes is cached on s_,
    // and the event pool holds events.
    arcpool_allocation_t* a = nullptr;
    ASSERT_OK(arcpool_allocate_async(alloc_, kBytes, 0, s_, 0, &a));
    ASSERT_OK(arcpool_transfer(a, t_));
    ASSERT_OK(arcpool_transfer(a, s_));
    ASSERT_OK(arcpool_deallocate_async(a, s_, 0));
    ASSERT_OK(arcpool_allocation_release(a));
    ASSERT_OK(arcpool_stream_synchronize(alloc_, s_));
    ASSERT_OK(arcpool_stream_synchronize(alloc_, t_));
  }
  void TearDown() override {
    if (alloc_ == nullptr) return;
    EXPECT_OK(arcpool_stream_destroy(alloc_, s_));
    EXPECT_OK(arcpool_stream_destroy(alloc_, t_));
    arcpool_allocator_destroy(alloc_);
    EXPECT_EQ("", take_simcuda_violations());
  }

  /// Checks the calls of `op` and prints them (the table in docs/performance.md).
  void expect_calls(const char* what, const call_counts& expected,
                    const std::function<void()>& op) {
    const call_counts measured = calls_of(op);
    std::printf("runtime calls of %s: %s\n", what, describe(measured).c_str());
    EXPECT_EQ(describe(expected), describe(measured)) << what;
  }

  static constexpr size_t kBytes = 4096;
  arcpool_allocator_t* alloc_ = nullptr;
  arcpool_stream_t s_ = nullptr;
  arcpool_stream_t t_ = nullptr;
};

TEST_F(RuntimeCalls, OfEachHotOperation) {
  arcpool_allocation_t* a = nullptr;
  // A cache hit: the capture check, in the pool's device.
  expect_calls("allocate_async (cache hit)", {{"cuCtxGetCurrent", 1}, {"cudaStreamIsCapturing", 1}},
               [&] { ASSERT_OK(arcpool_allocate_async(alloc_, kBytes, 0, s_, 0, &a)); });
  expect_calls("allocation_preserve + allocation_discard", {}, [&] {
    ASSERT_OK(arcpool_allocation_preserve(a));
    ASSERT_OK(arcpool_allocation_discard(a, nullptr));
  });
  // record_use of a created stream: its fence is taken at deallocation, nothing now but the
  // capture check.
  expect_calls("record_use (created stream)",
               {{"cuCtxGetCurrent", 1}, {"cudaStreamIsCapturing", 1}},
               [&] { ASSERT_OK(arcpool_record_use(a, t_)); });
  // transfer to s_: the receiver's capture check, a fence on each donor (t_ recorded as a use;
  // the current stream is s_ itself, so only t_), the receiver's wait.
  expect_calls("transfer",
               {{"cudaEventRecord", 1},
                {"cuCtxGetCurrent", 4},
                {"cudaStreamIsCapturing", 2},
                {"cudaStreamWaitEvent", 1}},
               [&] { ASSERT_OK(arcpool_transfer(a, t_)); });
  ASSERT_OK(arcpool_transfer(a, s_));
  // A same-stream free into the cache: the capture check only.
  expect_calls("deallocate_async (same stream, cached) + allocation_release",
               {{"cuCtxGetCurrent", 1}, {"cudaStreamIsCapturing", 1}}, [&] {
                 ASSERT_OK(arcpool_deallocate_async(a, s_, 0));
                 ASSERT_OK(arcpool_allocation_release(a));
               });
  void* p = nullptr;
  expect_calls("allocator_malloc_async + allocator_free_async (cache hit)",
               {{"cuCtxGetCurrent", 2}, {"cudaStreamIsCapturing", 2}}, [&] {
                 ASSERT_OK(arcpool_allocator_malloc_async(alloc_, kBytes, 0, s_, &p));
                 ASSERT_OK(arcpool_allocator_free_async(alloc_, p, s_));
               });
}

// The framework hooks (PyTorch's and CuPy's) on the legacy default stream, warm: the same
// calls as the by-pointer pair on a created stream. Finding the default allocator makes none.
TEST_F(RuntimeCalls, OfTheFrameworkHooksOnTheLegacyStream) {
  ASSERT_OK(arcpool_default_allocator_set(0, alloc_));
  void* warm = arcpool_malloc_async(kBytes, 0, nullptr);
  ASSERT_NE(nullptr, warm) << arcpool_last_error();
  ASSERT_OK(arcpool_free_async(warm, kBytes, 0, nullptr));
  expect_calls("malloc_async + free_async (framework hooks, legacy stream, cache hit)",
               {{"cuCtxGetCurrent", 2}, {"cudaStreamIsCapturing", 2}}, [&] {
                 void* p = arcpool_malloc_async(kBytes, 0, nullptr);
                 ASSERT_NE(nullptr, p) << arcpool_last_error();
                 ASSERT_OK(arcpool_free_async(p, kBytes, 0, nullptr));
               });
  ASSERT_EQ(cudaSuccess, cudaStreamSynchronize(nullptr));
  ASSERT_OK(arcpool_default_allocator_set(0, nullptr));
}

// An application stream arcpool does not know is resolved on every call (its handle may have
// been recycled), its device checked, and it has no cache: register streams used often. The
// pool allocation runs in relaxed capture mode (two exchanges): a capture elsewhere would
// otherwise refuse it and be invalidated (design.md §6).
TEST_F(RuntimeCalls, OfAnUnregisteredApplicationStream) {
  cudaStream_t app = nullptr;
  ASSERT_EQ(cudaSuccess, cudaStreamCreateWithFlags(&app, cudaStreamNonBlocking));
  auto s = reinterpret_cast<arcpool_stream_t>(app);
  arcpool_allocation_t* a = nullptr;
  expect_calls("allocate_async (unregistered application stream)",
               {{"cuCtxGetCurrent", 5},
                {"cuStreamGetCtx", 1},
                {"cudaMallocFromPoolAsync", 1},
                {"cudaStreamGetId", 1},
                {"cudaStreamIsCapturing", 2},
                {"cudaThreadExchangeStreamCaptureMode", 2}},
               [&] { ASSERT_OK(arcpool_allocate_async(alloc_, kBytes, 0, s, 0, &a)); });
  ASSERT_OK(arcpool_deallocate_async(a, s, 0));
  ASSERT_OK(arcpool_allocation_release(a));
  ASSERT_EQ(cudaSuccess, cudaStreamSynchronize(app));
  ASSERT_EQ(cudaSuccess, cudaStreamDestroy(app));
}

// A deferred free: the reclaim worker, once it saw every fence complete, makes the free stream
// wait on each fence before the free. The waits cost the GPU nothing; they put the free after the
// uses in stream order, which is all compute-sanitizer's stream-ordered race tracking follows
// (design.md §4).
TEST_F(RuntimeCalls, ADeferredFreeWaitsOnEachFenceBeforeTheFree) {
  arcpool_allocation_t* a = nullptr;
  ASSERT_OK(arcpool_allocate_async(alloc_, kBytes, 0, s_, 0, &a));
  ASSERT_OK(arcpool_record_use(a, t_));
  arcpool_stats_t st{};
  st.struct_size = sizeof st;
  st.version = ARCPOOL_STATS_VERSION;
  ASSERT_OK(arcpool_stats_get(alloc_, &st));
  const uint64_t frees_before = st.frees;
  const call_counts calls = calls_of([&] {
    ASSERT_OK(arcpool_deallocate_async(a, s_, ARCPOOL_DEALLOCATE_FLAG_DEFERRED));
    ASSERT_OK(arcpool_allocation_release(a));
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    do {
      ASSERT_OK(arcpool_stats_get(alloc_, &st));
    } while (st.frees == frees_before && std::chrono::steady_clock::now() < until);
  });
  ASSERT_EQ(frees_before + 1, st.frees) << "the reclaim worker never freed the block";
  const auto count = [&](const char* f) {
    const auto it = calls.find(f);
    return it == calls.end() ? uint64_t{0} : it->second;
  };
  EXPECT_EQ(2u, count("cudaEventRecord")) << "a fence on s_ (the current stream) and on t_";
  EXPECT_EQ(count("cudaEventRecord"), count("cudaStreamWaitEvent")) << describe(calls);
  EXPECT_EQ(1u, count("cudaFreeAsync")) << describe(calls);
}

// A thread with no current context (it never chose a device): every device guard makes the
// allocator's device current and then puts back "no context", two calls more per guard, so
// that arcpool never leaves a context current where the application had none.
TEST_F(RuntimeCalls, OnAThreadWithNoContext) {
  std::thread([&] {
    arcpool_allocation_t* a = nullptr;
    // Warm this thread's stream cache first, as SetUp warmed the main thread's.
    ASSERT_OK(arcpool_allocate_async(alloc_, kBytes, 0, s_, 0, &a));
    ASSERT_OK(arcpool_deallocate_async(a, s_, 0));
    ASSERT_OK(arcpool_allocation_release(a));
    expect_calls("allocate_async (cache hit, no context current)",
                 {{"cuCtxGetCurrent", 1}, {"cuCtxSetCurrent", 2}, {"cudaStreamIsCapturing", 1}},
                 [&] { ASSERT_OK(arcpool_allocate_async(alloc_, kBytes, 0, s_, 0, &a)); });
    ASSERT_OK(arcpool_deallocate_async(a, s_, 0));
    ASSERT_OK(arcpool_allocation_release(a));
  }).join();
}

/// The child of AfterTheDriverUnloadedTheFirstFailureStopsEveryCudaCall: a fresh process with
/// an allocator, a stream and two live allocations, whose driver then unloads as at a process's
/// exit. Exits 0 when the first call that meets the unloaded driver fails naming it, and every
/// later one (a free, a release, the stream's and the allocator's destruction, the reclaim
/// worker) makes no CUDA call.
[[noreturn]] void use_arcpool_after_the_driver_unloaded() {
  EXPECT_EQ(cudaSuccess, cudaSetDevice(0));
  arcpool_allocator_t* alloc = cuda_allocator();
  arcpool_stream_t s = nullptr;
  EXPECT_OK(arcpool_stream_create(alloc, &s));
  arcpool_allocation_t* a = nullptr;
  arcpool_allocation_t* b = nullptr;
  EXPECT_OK(arcpool_allocate_async(alloc, 4096, 0, s, 0, &a));
  EXPECT_OK(arcpool_allocate_async(alloc, 4096, 0, s, 0, &b));
  EXPECT_TRUE(simcuda_unload_driver());

  // cuCtxGetCurrent answers CUDA_ERROR_DEINITIALIZED, "the CUDA driver is in the process of
  // shutting down" (cuda.h): the first call fails, saying so, and nothing was freed.
  EXPECT_STATUS(ARCPOOL_STATUS_CUDA_ERROR, arcpool_deallocate_async(a, s, 0));
  EXPECT_NE(nullptr, std::strstr(arcpool_last_error(), "shutting down")) << arcpool_last_error();
  const uint64_t after_first = simcuda_calls("cuCtxGetCurrent");

  reset_simcuda_calls();
  (void)arcpool_deallocate_async(b, s, 0);  // an error or not: the process is exiting
  arcpool_allocation_release(a);
  arcpool_allocation_release(b);
  (void)arcpool_stream_destroy(alloc, s);  // "skipped: the process is exiting", or success
  arcpool_allocator_destroy(alloc);
  uint64_t later = 0;
  for (const char* f : {"cuCtxGetCurrent", "cuCtxSetCurrent", "cudaStreamIsCapturing",
                        "cudaFreeAsync", "cudaEventRecord", "cudaEventQuery", "cudaEventDestroy",
                        "cudaStreamDestroy", "cudaMemPoolDestroy", "cudaStreamSynchronize"}) {
    const uint64_t n = simcuda_calls(f);
    if (n != 0)
      std::fprintf(stderr, "after the first failure: %s called %llu times\n", f,
                   static_cast<unsigned long long>(n));
    later += n;
  }
  std::fprintf(stderr, "first failure: %llu cuCtxGetCurrent; later CUDA calls: %llu\n",
               static_cast<unsigned long long>(after_first),
               static_cast<unsigned long long>(later));
  std::exit(later == 0 && !::testing::Test::HasFailure() ? 0 : 1);
}

// At a process's exit the CUDA driver may be gone before arcpool's last calls (a framework
// freeing tensors from its own exit handlers). The runtime then answers
// cudaErrorCudartUnloading, and the driver's context functions CUDA_ERROR_DEINITIALIZED:
// whichever arcpool meets first marks the process as exiting (design.md §10, "Exit"), so that
// nothing after it calls CUDA again or waits on work that will never complete.
TEST(RuntimeCallsAtExit, AfterTheDriverUnloadedTheFirstFailureStopsEveryCudaCall) {
  if (!on_simcuda()) GTEST_SKIP() << "unloads the driver with simcuda_unload_driver";
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // a fresh process: the unload is for good
  EXPECT_EXIT(use_arcpool_after_the_driver_unloaded(), ::testing::ExitedWithCode(0),
              "later CUDA calls: 0");
}

/// The child of OnceTheProcessIsExitingTheIpcCallsMakeNoCudaCall: the CUDA driver of an
/// exportable owned pool, with a pointer's export data and an interprocess event made while the
/// process runs. Once it is exiting, each IPC call the exporter's watcher or an importer's
/// release can still make (design.md §10, "Exit") must answer "skipped" without calling CUDA.
[[noreturn]] void call_the_ipc_driver_while_exiting() {
  EXPECT_EQ(cudaSuccess, cudaSetDevice(0));
  arcpool_allocator_options_t options;
  arcpool_allocator_options_init(&options);
  options.driver = ARCPOOL_DRIVER_CUDA;
  options.pool_source = ARCPOOL_POOL_OWNED;
  options.ipc_handle_types = cudaMemHandleTypePosixFileDescriptor;
  arcpool_allocator_t* alloc = nullptr;
  EXPECT_OK(arcpool_allocator_create(&options, &alloc));
  if (alloc == nullptr) std::exit(1);
  detail::driver& drv = detail::from_handle(alloc)->drv();
  void* p = nullptr;
  EXPECT_OK(drv.pool_allocate(4096, nullptr, &p));
  detail::ipc_pointer_data pointer{};
  EXPECT_OK(drv.pool_export_pointer(p, &pointer));
  detail::event_handle event = nullptr;
  detail::ipc_event_data event_data{};
  EXPECT_OK(drv.ipc_event_create(&event, &event_data));

  detail::mark_process_exiting();
  reset_simcuda_calls();
  auto skipped = [](const char* call, arcpool_status_t status) {
    EXPECT_STATUS(ARCPOOL_STATUS_CUDA_ERROR, status) << call;
    EXPECT_NE(nullptr, std::strstr(arcpool_last_error(), "the process is exiting"))
        << call << ": " << arcpool_last_error();
  };
  int fd = -1;
  skipped("pool_export_fd", drv.pool_export_fd(&fd));
  detail::ipc_pointer_data again{};
  skipped("pool_export_pointer", drv.pool_export_pointer(p, &again));
  detail::event_handle created = nullptr;
  detail::ipc_event_data created_data{};
  skipped("ipc_event_create", drv.ipc_event_create(&created, &created_data));
  detail::event_handle opened = nullptr;
  skipped("ipc_event_open", drv.ipc_event_open(event_data, &opened));
  detail::imported_pool pool = nullptr;
  skipped("pool_import_fd", drv.pool_import_fd(0, &pool));
  void* imported = nullptr;
  skipped("import_pointer", drv.import_pointer(nullptr, pointer, &imported));
  uint64_t later = 0;
  for (const char* f :
       {"cuCtxGetCurrent", "cuCtxSetCurrent", "cudaMemPoolExportToShareableHandle",
        "cudaMemPoolExportPointer", "cudaEventCreateWithFlags", "cudaIpcGetEventHandle",
        "cudaIpcOpenEventHandle", "cudaMemPoolImportFromShareableHandle", "cudaMemPoolGetAccess",
        "cudaMemPoolImportPointer", "cudaEventDestroy"}) {
    if (const uint64_t n = simcuda_calls(f); n != 0) {
      std::fprintf(stderr, "while exiting: %s called %llu times\n", f,
                   static_cast<unsigned long long>(n));
      later += n;
    }
  }
  std::fprintf(stderr, "CUDA calls while exiting: %llu\n", static_cast<unsigned long long>(later));
  std::exit(later == 0 && !::testing::Test::HasFailure() ? 0 : 1);
}

// The exporter's watcher thread reads the importer's releases while the process exits (its
// atexit hooks, then the runtime's teardown), and an importer's last releases may run there
// too: their IPC calls are skipped once arcpool knows the process is exiting, as every other
// call of the CUDA driver is.
TEST(RuntimeCallsAtExit, OnceTheProcessIsExitingTheIpcCallsMakeNoCudaCall) {
  if (!on_simcuda()) GTEST_SKIP() << "counts CUDA calls with simcuda's counters";
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // a fresh process: exiting is for good
  EXPECT_EXIT(call_the_ipc_driver_while_exiting(), ::testing::ExitedWithCode(0),
              "CUDA calls while exiting: 0");
}

}  // namespace
}  // namespace arcpool::test
