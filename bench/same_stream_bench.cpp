// Same-stream allocate + free pairs by size (256 B … 64 MiB), arcpool with the cache on and
// off, against raw cudaMallocAsync / cudaFreeAsync pairs and cudaMalloc / cudaFree in the same
// binary (design.md §13). Target (issue 4): a cached pair ≥ 10× faster than a raw async pair.
// The null-driver rows measure the same path with no CUDA underneath. The runtime-call rows time,
// one by one, the calls a cached pair makes on the CUDA driver (docs/performance.md, "Runtime
// calls per operation"): the pair's cost above the null driver's is theirs.
#include <cuda_runtime_api.h>

#include "bench_defaults.hpp"

namespace arcpool::bench {
namespace {

/// A raw cudaMallocAsync + cudaFreeAsync pair on one stream, ns per pair.
double raw_async_pair_ns(size_t bytes, cudaStream_t s) {
  return nanoseconds_per_op(
      [&] {
        void* p = nullptr;
        cudaMallocAsync(&p, bytes, s);
        cudaFreeAsync(p, s);
      },
      20000);
}

void arcpool_pairs(benchmark::State& state, arcpool_driver_kind_t driver, bool cache) {
  if (driver == ARCPOOL_DRIVER_CUDA && skip_without_gpu(state)) return;
  const size_t bytes = static_cast<size_t>(state.range(0));
  arcpool_allocator_t* a = make_allocator(driver, cache);
  arcpool_stream_t s = nullptr;
  check(arcpool_stream_create(a, &s), "stream_create");
  for (auto _ : state) {
    arcpool_allocation_t* h = nullptr;
    arcpool_allocate_async(a, bytes, 0, s, 0, &h);
    arcpool_deallocate_async(h, s, 0);
    arcpool_allocation_release(h);
  }
  state.SetItemsProcessed(state.iterations());
  if (driver == ARCPOOL_DRIVER_CUDA) {
    const double raw = raw_async_pair_ns(bytes, reinterpret_cast<cudaStream_t>(s));
    report_ratio(state, raw, "raw_async_pair");
  }
  arcpool_stream_synchronize(a, s);
  arcpool_stream_destroy(a, s);
  arcpool_allocator_destroy(a);
}

void BM_SameStreamCached(benchmark::State& state) {
  arcpool_pairs(state, ARCPOOL_DRIVER_CUDA, true);
}
void BM_SameStreamUncached(benchmark::State& state) {
  arcpool_pairs(state, ARCPOOL_DRIVER_CUDA, false);
}
void BM_SameStreamCachedNullDriver(benchmark::State& state) {
  arcpool_pairs(state, ARCPOOL_DRIVER_NULL, true);
}

void BM_RawMallocAsyncPair(benchmark::State& state) {
  if (skip_without_gpu(state)) return;
  cudaStream_t s = nullptr;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  const size_t bytes = static_cast<size_t>(state.range(0));
  for (auto _ : state) {
    void* p = nullptr;
    cudaMallocAsync(&p, bytes, s);
    cudaFreeAsync(p, s);
  }
  state.SetItemsProcessed(state.iterations());
  cudaStreamSynchronize(s);
  cudaStreamDestroy(s);
}

void BM_RawMallocFreePair(benchmark::State& state) {
  if (skip_without_gpu(state)) return;
  const size_t bytes = static_cast<size_t>(state.range(0));
  for (auto _ : state) {
    void* p = nullptr;
    cudaMalloc(&p, bytes);
    cudaFree(p);
  }
  state.SetItemsProcessed(state.iterations());
}

/// cudaStreamIsCapturing, each operation's capture check, on a created non-blocking stream
/// (range 0) or on the legacy default stream (range 1).
void BM_RuntimeStreamIsCapturing(benchmark::State& state) {
  if (skip_without_gpu(state)) return;
  cudaStream_t s = cudaStreamLegacy;
  if (state.range(0) == 0) cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  for (auto _ : state) {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    benchmark::DoNotOptimize(cudaStreamIsCapturing(s, &status));
    benchmark::DoNotOptimize(status);
  }
  state.SetItemsProcessed(state.iterations());
  state.SetLabel(state.range(0) == 0 ? "created stream" : "legacy default stream");
  if (state.range(0) == 0) cudaStreamDestroy(s);
}

/// cuCtxGetCurrent, through the runtime's driver entry point as arcpool finds it: the device
/// guard's one call when the thread's context is already the allocator's.
void BM_DriverCtxGetCurrent(benchmark::State& state) {
  if (skip_without_gpu(state)) return;
  cudaFree(nullptr);  // the primary context, current on this thread
  using get_current_t = int (*)(void**);
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  if (cudaGetDriverEntryPointByVersion("cuCtxGetCurrent", &fn, 12000, cudaEnableDefault, &found) !=
          cudaSuccess ||
      found != cudaDriverEntryPointSuccess) {
    state.SkipWithError("cuCtxGetCurrent: no driver entry point");
    return;
  }
  const auto get_current = reinterpret_cast<get_current_t>(fn);
  for (auto _ : state) {
    void* context = nullptr;
    benchmark::DoNotOptimize(get_current(&context));
    benchmark::DoNotOptimize(context);
  }
  state.SetItemsProcessed(state.iterations());
}

#define ARCPOOL_BENCH_SIZES RangeMultiplier(16)->Range(256, 64 << 20)
BENCHMARK(BM_SameStreamCached)->ARCPOOL_BENCH_SIZES;
BENCHMARK(BM_SameStreamUncached)->ARCPOOL_BENCH_SIZES;
BENCHMARK(BM_RawMallocAsyncPair)->ARCPOOL_BENCH_SIZES;
BENCHMARK(BM_RawMallocFreePair)->ARCPOOL_BENCH_SIZES;
BENCHMARK(BM_SameStreamCachedNullDriver)->ARCPOOL_BENCH_SIZES;
BENCHMARK(BM_RuntimeStreamIsCapturing)->Arg(0)->Arg(1);
BENCHMARK(BM_DriverCtxGetCurrent);

}  // namespace
}  // namespace arcpool::bench
