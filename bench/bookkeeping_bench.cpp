// arcpool's own bookkeeping on the null driver (no CUDA calls, fake addresses), where a few
// nanoseconds are visible (design.md §13). Baseline in the same binary: the null driver's raw
// pool_allocate + pool_free. Targets (issue 4): ≤ 50 ns median per operation; preserve /
// discard ≤ 10 ns uncontended and ≤ 40 ns at 4 threads. Uses internals on purpose: the null
// driver itself for the baseline (detail::from_handle) and the NVTX guard alone.
#include <benchmark/benchmark.h>

#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "bench_defaults.hpp"
#include "core/allocator.hpp"
#include "observe/nvtx.hpp"

namespace arcpool::bench {
namespace {

/// One null-driver allocator, also device 0's default, and one stream per thread, shared by the
/// threads of a benchmark.
struct null_fixture {
  arcpool_allocator_t* alloc = make_allocator(ARCPOOL_DRIVER_NULL);
  std::vector<arcpool_stream_t> streams;
  null_fixture() {
    for (int i = 0; i < 64; ++i) {
      arcpool_stream_t s = nullptr;
      check(arcpool_stream_create(alloc, &s), "stream_create");
      streams.push_back(s);
    }
    // The framework hooks' default allocator (BM_FrameworkHooks).
    check(arcpool_default_allocator_set(0, alloc), "default_allocator_set");
  }
  static null_fixture& get() {
    static null_fixture f;
    return f;
  }
};

double raw_null_pair_ns() {
  static const double ns = [] {
    auto& drv = detail::from_handle(null_fixture::get().alloc)->drv();
    arcpool_stream_t s = null_fixture::get().streams[0];
    return nanoseconds_per_op(
        [&] {
          void* p = nullptr;
          drv.pool_allocate(4096, s, &p);
          drv.pool_free(p, 4096, s);
          benchmark::DoNotOptimize(p);
        },
        1 << 20);
  }();
  return ns;
}

void BM_AllocateDeallocateSameStream(benchmark::State& state) {
  auto& f = null_fixture::get();
  arcpool_stream_t s = f.streams[state.thread_index()];
  for (auto _ : state) {
    arcpool_allocation_t* a = nullptr;
    arcpool_allocate_async(f.alloc, 4096, 0, s, 0, &a);
    arcpool_deallocate_async(a, s, 0);
    arcpool_allocation_release(a);
  }
  state.SetItemsProcessed(state.iterations() * 2);
  if (state.thread_index() == 0) report_ratio(state, raw_null_pair_ns(), "raw_null_pair");
}
BENCHMARK(BM_AllocateDeallocateSameStream)->ARCPOOL_BENCH_THREADS;

/// The by-pointer pair frameworks take (arcpool_allocator_malloc_async and _free_async), each
/// thread on its own stream: what the process-wide map of by-pointer allocations costs as
/// threads are added.
void BM_MallocFreeByPointer(benchmark::State& state) {
  auto& f = null_fixture::get();
  arcpool_stream_t s = f.streams[state.thread_index()];
  for (auto _ : state) {
    void* p = nullptr;
    arcpool_allocator_malloc_async(f.alloc, 4096, 0, s, &p);
    arcpool_allocator_free_async(f.alloc, p, s);
  }
  state.SetItemsProcessed(state.iterations() * 2);
  if (state.thread_index() == 0) report_ratio(state, raw_null_pair_ns(), "raw_null_pair");
}
BENCHMARK(BM_MallocFreeByPointer)->ARCPOOL_BENCH_THREADS;

/// The by-pointer pair on the legacy default stream (NULL), which PyTorch's and CuPy's default
/// streams are: every thread on the one stream, its cache and its statistics row.
void BM_MallocFreeByPointerOnTheLegacyStream(benchmark::State& state) {
  auto& f = null_fixture::get();
  for (auto _ : state) {
    void* p = nullptr;
    arcpool_allocator_malloc_async(f.alloc, 4096, 0, nullptr, &p);
    arcpool_allocator_free_async(f.alloc, p, nullptr);
  }
  state.SetItemsProcessed(state.iterations() * 2);
  if (state.thread_index() == 0) report_ratio(state, raw_null_pair_ns(), "raw_null_pair");
}
BENCHMARK(BM_MallocFreeByPointerOnTheLegacyStream)->ARCPOOL_BENCH_THREADS;

/// The calls PyTorch's and CuPy's hooks make (arcpool_malloc_async, arcpool_free_async: device
/// 0's default allocator, here the null-driver one), each thread on its own stream: what
/// finding the default allocator costs as threads are added.
void BM_FrameworkHooks(benchmark::State& state) {
  auto& f = null_fixture::get();
  arcpool_stream_t s = f.streams[state.thread_index()];
  for (auto _ : state) {
    void* p = arcpool_malloc_async(4096, 0, s);
    arcpool_free_async(p, 4096, 0, s);
  }
  state.SetItemsProcessed(state.iterations() * 2);
  if (state.thread_index() == 0) report_ratio(state, raw_null_pair_ns(), "raw_null_pair");
}
BENCHMARK(BM_FrameworkHooks)->ARCPOOL_BENCH_THREADS;

void BM_PreserveDiscardOwnAllocation(benchmark::State& state) {
  auto& f = null_fixture::get();
  arcpool_allocation_t* a = nullptr;
  check(arcpool_allocate_async(f.alloc, 256, 0, f.streams[state.thread_index()], 0, &a),
        "allocate");
  for (auto _ : state) {
    arcpool_allocation_preserve(a);
    int last = 0;
    arcpool_allocation_discard(a, &last);
    benchmark::DoNotOptimize(last);
  }
  state.SetItemsProcessed(state.iterations() * 2);
  arcpool_allocation_discard_and_release(a);
}
BENCHMARK(BM_PreserveDiscardOwnAllocation)->ARCPOOL_BENCH_THREADS;

arcpool_allocation_t* g_shared = nullptr;

void BM_PreserveDiscardSharedAllocation(benchmark::State& state) {
  auto& f = null_fixture::get();
  if (state.thread_index() == 0) {
    check(arcpool_allocate_async(f.alloc, 256, 0, f.streams[0], 0, &g_shared), "allocate");
  }
  for (auto _ : state) {  // the first iteration starts after every thread's setup
    arcpool_allocation_preserve(g_shared);
    int last = 0;
    arcpool_allocation_discard(g_shared, &last);
    benchmark::DoNotOptimize(last);
  }
  state.SetItemsProcessed(state.iterations() * 2);
  if (state.thread_index() == 0) arcpool_allocation_discard_and_release(g_shared);
}
BENCHMARK(BM_PreserveDiscardSharedAllocation)->ARCPOOL_BENCH_THREADS;

void BM_Transfer(benchmark::State& state) {
  auto& f = null_fixture::get();
  arcpool_stream_t a_stream = f.streams[2 * state.thread_index()];
  arcpool_stream_t b_stream = f.streams[2 * state.thread_index() + 1];
  arcpool_allocation_t* a = nullptr;
  check(arcpool_allocate_async(f.alloc, 256, 0, a_stream, 0, &a), "allocate");
  for (auto _ : state) {
    arcpool_transfer(a, b_stream);
    arcpool_transfer(a, a_stream);
  }
  state.SetItemsProcessed(state.iterations() * 2);
  arcpool_allocation_discard_and_release(a);
}
BENCHMARK(BM_Transfer)->ARCPOOL_BENCH_THREADS;

void BM_RecordUse(benchmark::State& state) {
  auto& f = null_fixture::get();
  arcpool_stream_t origin = f.streams[2 * state.thread_index()];
  arcpool_stream_t user = f.streams[2 * state.thread_index() + 1];
  arcpool_allocation_t* a = nullptr;
  check(arcpool_allocate_async(f.alloc, 256, 0, origin, 0, &a), "allocate");
  for (auto _ : state)
    arcpool_record_use(a, user);
  state.SetItemsProcessed(state.iterations());
  arcpool_allocation_discard_and_release(a);
}
BENCHMARK(BM_RecordUse)->ARCPOOL_BENCH_THREADS;

/// A deferred free on another stream: its fences go to the reclaim worker, which releases them
/// once they completed. "events_per_pair": events the pool created per pair, over all threads
/// (a fence the worker has no room for goes back to the thread that took it, event_pool).
void BM_CrossStreamDeferredPair(benchmark::State& state) {
  auto& f = null_fixture::get();
  arcpool_stream_t origin = f.streams[2 * state.thread_index()];
  arcpool_stream_t other = f.streams[2 * state.thread_index() + 1];
  const detail::event_pool& events = detail::from_handle(f.alloc)->events();
  const size_t created_before = events.events_created();
  for (auto _ : state) {
    arcpool_allocation_t* a = nullptr;
    arcpool_allocate_async(f.alloc, 4096, 0, origin, 0, &a);
    arcpool_deallocate_async(a, other, ARCPOOL_DEALLOCATE_FLAG_DEFERRED);
    arcpool_allocation_release(a);
  }
  state.SetItemsProcessed(state.iterations() * 2);
  if (state.thread_index() == 0) {
    state.counters["events_per_pair"] =
        benchmark::Counter(static_cast<double>(events.events_created() - created_before) /
                           static_cast<double>(state.iterations() * state.threads()));
  }
}
BENCHMARK(BM_CrossStreamDeferredPair)->ThreadRange(1, 4)->UseRealTime();

/// Allocations made here and released on another thread, a batch at a time (a producer and its
/// consumer; a forward pass whose tensors autograd's threads free). Once the consumer's record
/// list is full, each record's block goes back to this thread's inbox, and this thread's
/// allocations reuse them instead of the heap (support/thread_state.hpp). Items: allocations.
void BM_ReleasedOnAnotherThread(benchmark::State& state) {
  auto& f = null_fixture::get();
  arcpool_stream_t s = f.streams[0];
  constexpr size_t kBatch = 1024;
  std::mutex m;
  std::condition_variable cv;
  std::vector<arcpool_allocation_t*> handed;  // at most one batch in flight
  bool done = false;
  std::thread consumer([&] {
    std::vector<arcpool_allocation_t*> mine;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(m);
        cv.wait(lock, [&] { return !handed.empty() || done; });
        if (handed.empty()) return;
        mine.swap(handed);
      }
      cv.notify_all();
      for (arcpool_allocation_t* a : mine)
        arcpool_allocation_release(a);
      mine.clear();
    }
  });
  std::vector<arcpool_allocation_t*> batch;
  auto hand_over = [&](bool last) {
    std::unique_lock<std::mutex> lock(m);
    cv.wait(lock, [&] { return handed.empty(); });
    handed.swap(batch);
    done = last;
    cv.notify_all();
  };
  for (auto _ : state) {
    arcpool_allocation_t* a = nullptr;
    arcpool_allocate_async(f.alloc, 4096, 0, s, 0, &a);
    arcpool_deallocate_async(a, s, 0);
    batch.push_back(a);
    if (batch.size() == kBatch) hand_over(false);
  }
  hand_over(true);
  consumer.join();
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_ReleasedOnAnotherThread)->UseRealTime();

/// What an NVTX range costs arcpool when no tool is attached (compiled in, the default): the
/// guard every public operation constructs. Expected: ~1 ns (a load and a branch).
void BM_NvtxRangeWithoutTool(benchmark::State& state) {
  if (detail::nvtx::enabled()) {
    state.SkipWithError("an NVTX tool is attached: this measures the no-tool cost");
    return;
  }
  for (auto _ : state) {
    detail::nvtx::range r(detail::nvtx::op::allocate, 4096, nullptr);
    benchmark::DoNotOptimize(&r);
  }
}
BENCHMARK(BM_NvtxRangeWithoutTool);

}  // namespace
}  // namespace arcpool::bench
