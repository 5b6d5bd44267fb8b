// Fill and verify against a device-to-device copy in the same run (design.md §12): the copy
// counts bytes read plus bytes written, fill bytes written, verify bytes read. Target (issue 3):
// fill and verify ≥ 0.85 of the copy's rate at ≥ 256 MiB on the H200. GPU only.
#include <cuda_runtime_api.h>

#include "bench_defaults.hpp"
#include "kernels.hpp"

namespace arcpool::bench {
namespace {

/// Device bytes per second of `op` (bytes moved per call), timed with CUDA events.
template <class F>
double bytes_per_second(F&& op, size_t bytes_moved, cudaStream_t s, int repeats = 10) {
  op();  // warm-up
  cudaEvent_t start = nullptr, stop = nullptr;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  cudaEventRecord(start, s);
  for (int i = 0; i < repeats; ++i)
    op();
  cudaEventRecord(stop, s);
  cudaEventSynchronize(stop);
  float ms = 0;
  cudaEventElapsedTime(&ms, start, stop);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return static_cast<double>(bytes_moved) * repeats / (ms * 1e-3);
}

void BM_FillVerifyVsCopy(benchmark::State& state) {
  if (skip_without_gpu(state)) return;
  const size_t bytes = static_cast<size_t>(state.range(0)) << 20;
  cudaStream_t s = nullptr;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  void* a = nullptr;
  void* b = nullptr;
  kernels::verify_counters* counters = nullptr;
  if (cudaMalloc(&a, bytes) != cudaSuccess || cudaMalloc(&b, bytes) != cudaSuccess ||
      cudaMalloc(reinterpret_cast<void**>(&counters), sizeof(*counters)) != cudaSuccess) {
    state.SkipWithError("cudaMalloc failed");
    return;
  }
  cudaMemset(counters, 0, sizeof(*counters));
  double copy = 0, fill = 0, verify = 0;
  for (auto _ : state) {
    copy = bytes_per_second([&] { cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, s); },
                            2 * bytes, s);
    fill = bytes_per_second([&] { kernels::fill_async(a, bytes, 7, 0, s); }, bytes, s);
    verify =
        bytes_per_second([&] { kernels::verify_async(a, bytes, 7, 0, counters, s); }, bytes, s);
  }
  kernels::verify_counters host{};
  cudaMemcpy(&host, counters, sizeof(host), cudaMemcpyDeviceToHost);
  state.counters["copy_GBps"] = copy / 1e9;
  state.counters["fill_GBps"] = fill / 1e9;
  state.counters["verify_GBps"] = verify / 1e9;
  state.counters["fill_vs_copy"] = fill / copy;
  state.counters["verify_vs_copy"] = verify / copy;
  state.counters["verify_mismatches"] = static_cast<double>(host.mismatches);
  cudaFree(a);
  cudaFree(b);
  cudaFree(counters);
  cudaStreamDestroy(s);
}
BENCHMARK(BM_FillVerifyVsCopy)->Arg(64)->Arg(256)->Arg(1024)->Iterations(1)->UseRealTime();

}  // namespace
}  // namespace arcpool::bench
