// Cross-stream frees (design.md §4, §13), for every routing strategy and for the driver's own
// behaviour (a free on the foreign stream, the next allocation reusing it through the pool's
// internal dependencies):
// - makespan: a caller stream frees buffers still used by a busy user stream and runs its own
//   short kernels; against the same kernels with no frees. A false dependency shows as the
//   caller's kernels waiting for the user's long ones (ratio_vs_no_free well above 1);
// - reusable: microseconds from the user's last kernel finishing until the memory is back;
// - CPU ahead: peak pool reservation when the CPU enqueues many rounds before the GPU runs them.
// Target (issue 4): the default routing keeps the makespan within 5 % of the no-free run while
// the driver's internal dependencies visibly do not. GPU only.
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "bench_defaults.hpp"
#include "kernels.hpp"

namespace arcpool::bench {
namespace {

constexpr int kRounds = 20;
constexpr uint64_t kUserNs = 200'000;   // the user stream's long kernel
constexpr uint64_t kCallerNs = 20'000;  // the caller stream's own short kernel
constexpr size_t kBytes = 16 << 20;

enum strategy : int { no_free, wait_and_free, prefer_origin, deferred, driver_internal, count };
const char* const kNames[] = {"no_free", "wait_and_free", "prefer_origin", "deferred",
                              "driver_internal_dependencies"};
const uint32_t kFlags[] = {0, ARCPOOL_DEALLOCATE_FLAG_WAIT_AND_FREE,
                           ARCPOOL_DEALLOCATE_FLAG_PREFER_ORIGIN, ARCPOOL_DEALLOCATE_FLAG_DEFERRED,
                           0};

/// Aborts unless a CUDA call succeeded: a benchmark that hides a failure measures nothing.
void cuda_check(cudaError_t status, const char* what) {
  if (status == cudaSuccess) return;
  std::fprintf(stderr, "benchmark: %s failed: %s\n", what, cudaGetErrorName(status));
  std::abort();
}

cudaStream_t cu(arcpool_stream_t s) {
  return reinterpret_cast<cudaStream_t>(s);
}

struct streams3 {
  arcpool_allocator_t* alloc = make_allocator(ARCPOOL_DRIVER_CUDA, /*cache=*/false);
  arcpool_stream_t origin = nullptr, user = nullptr, caller = nullptr;
  cudaMemPool_t internal_pool = nullptr;  // the device's default pool: internal deps on
  cudaEvent_t allocated = nullptr;        // orders the user's stream after the allocation
  streams3() {
    check(arcpool_stream_create(alloc, &origin), "stream_create");
    check(arcpool_stream_create(alloc, &user), "stream_create");
    check(arcpool_stream_create(alloc, &caller), "stream_create");
    cuda_check(cudaDeviceGetDefaultMemPool(&internal_pool, 0), "cudaDeviceGetDefaultMemPool");
    int on = 1;
    cuda_check(
        cudaMemPoolSetAttribute(internal_pool, cudaMemPoolReuseAllowInternalDependencies, &on),
        "cudaMemPoolSetAttribute");
    // The default pool outlives every row: start its high-water mark afresh for this one.
    cuda_check(cudaMemPoolTrimTo(internal_pool, 0), "cudaMemPoolTrimTo");
    uint64_t zero = 0;
    cuda_check(cudaMemPoolSetAttribute(internal_pool, cudaMemPoolAttrReservedMemHigh, &zero),
               "cudaMemPoolSetAttribute");
    cuda_check(cudaEventCreateWithFlags(&allocated, cudaEventDisableTiming), "cudaEventCreate");
  }
  ~streams3() {
    cudaEventDestroy(allocated);
    for (auto s : {origin, user, caller})
      arcpool_stream_synchronize(alloc, s);
    arcpool_allocator_trim(alloc, 0);
    for (auto s : {origin, user, caller})
      arcpool_stream_destroy(alloc, s);
    arcpool_allocator_destroy(alloc);
  }
  void sync() {
    for (auto s : {origin, user, caller})
      cudaStreamSynchronize(cu(s));
  }
};

/// One round: a buffer made on the origin, used by the user's long kernel, freed by the caller
/// (strategy), then the caller's own short kernel.
void round(streams3& s, int how) {
  if (how == driver_internal) {
    // The driver's way: the origin allocates from a pool that reuses blocks freed on other
    // streams by waiting on them internally; the user's stream is ordered after the allocation
    // (as arcpool_transfer orders it), uses the block and frees it after its last use.
    void* p = nullptr;
    cuda_check(cudaMallocFromPoolAsync(&p, kBytes, s.internal_pool, cu(s.origin)),
               "cudaMallocFromPoolAsync");
    cuda_check(cudaEventRecord(s.allocated, cu(s.origin)), "cudaEventRecord");
    cuda_check(cudaStreamWaitEvent(cu(s.user), s.allocated, 0), "cudaStreamWaitEvent");
    kernels::spin_async(kUserNs, cu(s.user));
    cuda_check(cudaFreeAsync(p, cu(s.user)), "cudaFreeAsync");
    kernels::spin_async(kCallerNs, cu(s.caller));
    return;
  }
  arcpool_allocation_t* a = nullptr;
  arcpool_allocate_async(s.alloc, kBytes, 0, s.origin, 0, &a);
  arcpool_transfer(a, s.user);
  kernels::spin_async(kUserNs, cu(s.user));
  if (how == no_free) {
    arcpool_allocation_release(a);  // never deallocated: an implicit free happens at the end
  } else {
    arcpool_deallocate_async(a, s.caller, kFlags[how]);
    arcpool_allocation_release(a);
  }
  kernels::spin_async(kCallerNs, cu(s.caller));
}

void BM_CrossStreamMakespan(benchmark::State& state) {
  if (skip_without_gpu(state)) return;
  const int how = static_cast<int>(state.range(0));
  state.SetLabel(kNames[how]);
  streams3 s;
  double caller_seconds = 0;
  double baseline_seconds = 0;
  for (auto _ : state) {
    s.sync();
    const auto start = std::chrono::steady_clock::now();
    for (int r = 0; r < kRounds; ++r)
      round(s, how);
    cudaStreamSynchronize(cu(s.caller));
    caller_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    s.sync();
    state.PauseTiming();  // the same kernels with no frees, in the same run
    const auto base = std::chrono::steady_clock::now();
    for (int r = 0; r < kRounds; ++r) {
      kernels::spin_async(kUserNs, cu(s.user));
      kernels::spin_async(kCallerNs, cu(s.caller));
    }
    cudaStreamSynchronize(cu(s.caller));
    baseline_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - base).count();
    s.sync();
    state.ResumeTiming();
  }
  state.counters["caller_makespan_us"] = caller_seconds * 1e6 / state.iterations();
  state.counters["no_free_makespan_us"] = baseline_seconds * 1e6 / state.iterations();
  state.counters["ratio_vs_no_free"] = caller_seconds / baseline_seconds;
}
BENCHMARK(BM_CrossStreamMakespan)->DenseRange(0, strategy::count - 1)->UseRealTime();

void BM_CrossStreamReusable(benchmark::State& state) {
  if (skip_without_gpu(state)) return;
  const int how = static_cast<int>(state.range(0));
  state.SetLabel(kNames[how]);
  streams3 s;
  double waited = 0;
  for (auto _ : state) {
    arcpool_stats_t st{};
    st.struct_size = sizeof(st);
    st.version = ARCPOOL_STATS_VERSION;
    arcpool_stats_get(s.alloc, &st);
    const uint64_t frees_before = st.frees;
    arcpool_allocation_t* a = nullptr;
    arcpool_allocate_async(s.alloc, kBytes, 0, s.origin, 0, &a);
    arcpool_transfer(a, s.user);
    kernels::spin_async(kUserNs, cu(s.user));
    arcpool_deallocate_async(a, s.caller, kFlags[how]);
    arcpool_allocation_release(a);
    cudaStreamSynchronize(cu(s.user));  // the last use finished
    const auto done = std::chrono::steady_clock::now();
    do {  // back in the pool: its free was enqueued (deferred) and the streams reached it
      arcpool_stats_get(s.alloc, &st);
    } while (st.frees == frees_before);
    s.sync();
    waited += std::chrono::duration<double>(std::chrono::steady_clock::now() - done).count();
  }
  state.counters["reusable_after_us"] = waited * 1e6 / state.iterations();
}
BENCHMARK(BM_CrossStreamReusable)
    ->Arg(wait_and_free)
    ->Arg(prefer_origin)
    ->Arg(deferred)
    ->UseRealTime();

void BM_CrossStreamCpuAhead(benchmark::State& state) {
  if (skip_without_gpu(state)) return;
  const int how = static_cast<int>(state.range(0));
  state.SetLabel(kNames[how]);
  uint64_t peak = 0;
  for (auto _ : state) {
    streams3 s;
    for (int r = 0; r < 100; ++r)
      round(s, how);  // the CPU runs 100 rounds ahead
    s.sync();
    arcpool_stats_t st{};
    st.struct_size = sizeof(st);
    st.version = ARCPOOL_STATS_VERSION;
    arcpool_stats_get(s.alloc, &st);
    uint64_t driver_peak = 0;
    cudaMemPoolGetAttribute(s.internal_pool, cudaMemPoolAttrReservedMemHigh, &driver_peak);
    peak = how == driver_internal ? driver_peak : st.pool_reserved_bytes_peak;
  }
  state.counters["peak_reserved_MiB"] = static_cast<double>(peak) / (1 << 20);
}
BENCHMARK(BM_CrossStreamCpuAhead)
    ->DenseRange(wait_and_free, strategy::count - 1)
    ->Iterations(1)
    ->UseRealTime();

}  // namespace
}  // namespace arcpool::bench
