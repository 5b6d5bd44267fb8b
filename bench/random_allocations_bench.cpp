// RMM's random-allocations grid (cpp/benchmarks/random_allocations), so that arcpool's numbers
// line up with RMM's: N allocations (1k / 10k / 100k) of uniform sizes up to a maximum
// (1 … 4096 MiB), mixed with frees of random live allocations: 73 % of operations allocate
// while fewer than N were made and usage stays under 16000 MiB; a failed allocation frees
// instead. Resources: arcpool (CUDA, cache on), raw cudaMallocAsync on the device's default
// pool, and arcpool on the null driver (its bookkeeping alone).
#include <cuda_runtime_api.h>

#include <functional>
#include <random>
#include <vector>

#include "bench_defaults.hpp"

namespace arcpool::bench {
namespace {

constexpr size_t kMiB = size_t{1} << 20;
constexpr size_t kMaxUsage = 16000 * kMiB;
constexpr int kAllocatePercent = 73;

/// allocate(size) returns a handle (null on failure); release(handle) frees it.
struct resource {
  std::function<void*(size_t)> allocate;
  std::function<void(void*)> release;
};

void random_allocations(const resource& r, size_t count, size_t max_bytes) {
  std::default_random_engine rng;  // default seed: the same sequence every iteration
  std::uniform_int_distribution<int> percent(0, 99);
  std::uniform_int_distribution<size_t> size_of(1, max_bytes);
  struct live {
    void* handle;
    size_t bytes;
  };
  std::vector<live> allocations;
  size_t made = 0;
  size_t usage = 0;
  for (size_t i = 0; i < count * 2; ++i) {
    const size_t bytes = size_of(rng);
    bool allocate = true;
    if (!allocations.empty()) {
      allocate = percent(rng) < kAllocatePercent && made < count && usage + bytes < kMaxUsage;
    }
    void* h = allocate ? r.allocate(bytes) : nullptr;
    if (h != nullptr) {
      allocations.push_back({h, bytes});
      ++made;
      usage += bytes;
    } else if (!allocations.empty()) {
      const size_t victim = rng() % allocations.size();
      r.release(allocations[victim].handle);
      usage -= allocations[victim].bytes;
      allocations[victim] = allocations.back();
      allocations.pop_back();
    }
  }
  for (const live& a : allocations)
    r.release(a.handle);
}

resource arcpool_resource(arcpool_allocator_t* a, arcpool_stream_t s) {
  return {[a, s](size_t bytes) -> void* {
            arcpool_allocation_t* h = nullptr;
            return arcpool_allocate_async(a, bytes, 0, s, 0, &h) == ARCPOOL_STATUS_SUCCESS
                       ? static_cast<void*>(h)
                       : nullptr;
          },
          [s](void* h) {
            auto* allocation = static_cast<arcpool_allocation_t*>(h);
            arcpool_deallocate_async(allocation, s, 0);
            arcpool_allocation_release(allocation);
          }};
}

void run_arcpool(benchmark::State& state, arcpool_driver_kind_t driver) {
  if (driver == ARCPOOL_DRIVER_CUDA && skip_without_gpu(state)) return;
  arcpool_allocator_t* a = make_allocator(driver);
  arcpool_stream_t s = nullptr;
  check(arcpool_stream_create(a, &s), "stream_create");
  const resource r = arcpool_resource(a, s);
  for (auto _ : state) {
    random_allocations(r, static_cast<size_t>(state.range(0)),
                       static_cast<size_t>(state.range(1)) * kMiB);
  }
  arcpool_stats_t st{};
  st.struct_size = sizeof(st);
  st.version = ARCPOOL_STATS_VERSION;
  arcpool_stats_get(a, &st);
  state.counters["pool_reserved_peak_MiB"] =
      static_cast<double>(st.pool_reserved_bytes_peak) / kMiB;
  arcpool_stream_synchronize(a, s);
  arcpool_stream_destroy(a, s);
  arcpool_allocator_destroy(a);
}

void BM_RandomAllocationsArcpool(benchmark::State& state) {
  run_arcpool(state, ARCPOOL_DRIVER_CUDA);
}
void BM_RandomAllocationsArcpoolNullDriver(benchmark::State& state) {
  run_arcpool(state, ARCPOOL_DRIVER_NULL);
}

void BM_RandomAllocationsRawCudaAsync(benchmark::State& state) {
  if (skip_without_gpu(state)) return;
  cudaStream_t s = nullptr;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  const resource r{[s](size_t bytes) -> void* {
                     void* p = nullptr;
                     if (cudaMallocAsync(&p, bytes, s) != cudaSuccess) {
                       cudaGetLastError();
                       return nullptr;
                     }
                     return p;
                   },
                   [s](void* p) { cudaFreeAsync(p, s); }};
  for (auto _ : state) {
    random_allocations(r, static_cast<size_t>(state.range(0)),
                       static_cast<size_t>(state.range(1)) * kMiB);
  }
  cudaStreamSynchronize(s);
  cudaStreamDestroy(s);
}

void grid(benchmark::internal::Benchmark* b) {
  for (int count : {1000, 10000, 100000}) {
    for (int max_mib : {1, 4, 64, 256, 1024, 4096})
      b->Args({count, max_mib});
  }
  b->Unit(benchmark::kMillisecond);
}

BENCHMARK(BM_RandomAllocationsArcpool)->Apply(grid);
BENCHMARK(BM_RandomAllocationsRawCudaAsync)->Apply(grid);
BENCHMARK(BM_RandomAllocationsArcpoolNullDriver)->Apply(grid);

}  // namespace
}  // namespace arcpool::bench
