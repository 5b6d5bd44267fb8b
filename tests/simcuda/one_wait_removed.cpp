// The one-wait-removed check: a deallocation whose free must wait for a recorded use on another
// stream. Built twice: against arcpool, where simcuda sees no violation, and against arcpool
// with tests/simcuda/patches/free_without_fence_waits.patch applied, where simcuda must name
// the use after free. Prints "violations: none" or "violations:" and simcuda's report.
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "rule_check.hpp"

namespace {

using value_fn = CUresult(CUDAAPI*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);

value_fn entry_point(const char* symbol) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  cudaGetDriverEntryPointByVersion(symbol, &fn, 12000, cudaEnableDefault, &found);
  return reinterpret_cast<value_fn>(fn);
}

}  // namespace

int main() {
  const rule_check::take_fn take = rule_check::violations();
  if (take == nullptr) return 2;
  arcpool_allocator_options_t options;
  arcpool_allocator_options_init(&options);
  options.driver = ARCPOOL_DRIVER_CUDA;
  options.stream_cache_bytes = 0;
  arcpool_allocator_t* alloc = nullptr;
  CHECK(arcpool_allocator_create(&options, &alloc));
  arcpool_stream_t origin = nullptr, user = nullptr;
  CHECK(arcpool_stream_create(alloc, &origin));
  CHECK(arcpool_stream_create(alloc, &user));

  uint32_t* word = nullptr;  // a gate holding the user's stream
  cudaHostAlloc(reinterpret_cast<void**>(&word), sizeof(uint32_t), cudaHostAllocMapped);
  *word = 0;
  const value_fn wait = entry_point("cuStreamWaitValue32");
  if (word == nullptr || wait == nullptr) return 2;

  arcpool_allocation_t* a = nullptr;
  CHECK(arcpool_allocate_async(alloc, 1 << 20, 0, origin, 0, &a));
  void* p = nullptr;
  CHECK(arcpool_allocation_data(a, &p));
  CHECK(arcpool_stream_synchronize(alloc, origin));  // the user's work follows the allocation
  wait(reinterpret_cast<CUstream>(user), reinterpret_cast<CUdeviceptr>(word), 1,
       CU_STREAM_WAIT_VALUE_GEQ);
  cudaMemsetAsync(p, 7, 1 << 20, reinterpret_cast<cudaStream_t>(user));
  CHECK(arcpool_record_use(a, user));
  CHECK(arcpool_deallocate_async(a, origin, ARCPOOL_DEALLOCATE_FLAG_WAIT_AND_FREE));
  CHECK(arcpool_allocation_release(a));

  std::vector<char> report;
  const uint64_t found = rule_check::take_report(take, &report);
  __atomic_store_n(word, 1u, __ATOMIC_RELEASE);
  CHECK(arcpool_stream_synchronize(alloc, user));
  CHECK(arcpool_stream_synchronize(alloc, origin));
  CHECK(arcpool_stream_destroy(alloc, origin));
  CHECK(arcpool_stream_destroy(alloc, user));
  arcpool_allocator_destroy(alloc);
  cudaFreeHost(word);
  take(nullptr, 0);  // what teardown may add is not this check's subject
  rule_check::print_verdict(found, report, "");
  return 0;
}
