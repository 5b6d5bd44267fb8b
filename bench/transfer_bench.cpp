// Transfer against a raw timing-disabled cudaEventRecord + cudaStreamWaitEvent (target: ≤ 1.2×
// the raw record + wait), and thread × stream scaling of the cached same-stream path (target:
// 16 threads on 16 streams ≥ 10× one thread). Null-driver rows measure arcpool alone.
#include <cuda_runtime_api.h>

#include <vector>

#include "bench_defaults.hpp"

namespace arcpool::bench {
namespace {

void BM_TransferCuda(benchmark::State& state) {
  if (skip_without_gpu(state)) return;
  arcpool_allocator_t* a = make_allocator(ARCPOOL_DRIVER_CUDA);
  arcpool_stream_t s1 = nullptr;
  arcpool_stream_t s2 = nullptr;
  check(arcpool_stream_create(a, &s1), "stream_create");
  check(arcpool_stream_create(a, &s2), "stream_create");
  arcpool_allocation_t* h = nullptr;
  check(arcpool_allocate_async(a, 4096, 0, s1, 0, &h), "allocate");
  for (auto _ : state) {
    arcpool_transfer(h, s2);
    arcpool_transfer(h, s1);
  }
  state.SetItemsProcessed(state.iterations() * 2);
  cudaEvent_t e = nullptr;
  cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
  const double raw = nanoseconds_per_op(
      [&] {
        cudaEventRecord(e, reinterpret_cast<cudaStream_t>(s1));
        cudaStreamWaitEvent(reinterpret_cast<cudaStream_t>(s2), e, 0);
      },
      20000);
  report_ratio(state, raw, "raw_record_wait", 2);
  cudaEventDestroy(e);
  arcpool_deallocate_async(h, s1, 0);
  arcpool_allocation_release(h);
  arcpool_stream_synchronize(a, s1);
  arcpool_stream_synchronize(a, s2);
  arcpool_stream_destroy(a, s1);
  arcpool_stream_destroy(a, s2);
  arcpool_allocator_destroy(a);
}
BENCHMARK(BM_TransferCuda);

/// Threads × streams on the cached path: each thread allocates and frees on its own stream.
struct scaling_fixture {
  arcpool_allocator_t* alloc = nullptr;
  std::vector<arcpool_stream_t> streams;
  void setup(arcpool_driver_kind_t driver) {
    if (alloc != nullptr) return;
    alloc = make_allocator(driver);
    for (int i = 0; i < 16; ++i) {
      arcpool_stream_t s = nullptr;
      check(arcpool_stream_create(alloc, &s), "stream_create");
      streams.push_back(s);
    }
  }
};

void scaling(benchmark::State& state, arcpool_driver_kind_t driver, scaling_fixture& f) {
  if (driver == ARCPOOL_DRIVER_CUDA && skip_without_gpu(state)) return;
  if (state.thread_index() == 0) f.setup(driver);
  arcpool_stream_t s = nullptr;
  for (auto _ : state) {
    if (s == nullptr) s = f.streams[state.thread_index() % f.streams.size()];
    arcpool_allocation_t* h = nullptr;
    arcpool_allocate_async(f.alloc, 4096, 0, s, 0, &h);
    arcpool_deallocate_async(h, s, 0);
    arcpool_allocation_release(h);
  }
  state.SetItemsProcessed(state.iterations());
}

scaling_fixture g_cuda_scaling;
scaling_fixture g_null_scaling;
void BM_ThreadStreamScalingCuda(benchmark::State& state) {
  scaling(state, ARCPOOL_DRIVER_CUDA, g_cuda_scaling);
}
void BM_ThreadStreamScalingNullDriver(benchmark::State& state) {
  scaling(state, ARCPOOL_DRIVER_NULL, g_null_scaling);
}
BENCHMARK(BM_ThreadStreamScalingCuda)->ARCPOOL_BENCH_THREADS;
BENCHMARK(BM_ThreadStreamScalingNullDriver)->ARCPOOL_BENCH_THREADS;

}  // namespace
}  // namespace arcpool::bench
