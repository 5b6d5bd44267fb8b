// The graph pool's branch rule: a block freed during a capture is lent again only on the stream
// that freed it, never to an unjoined branch of the graph. Built twice: against arcpool, where
// simcuda sees no violation on replay, and against arcpool with
// tests/simcuda/patches/graph_pool_lends_across_branches.patch applied, where the two branches'
// writes of the shared block race on replay and simcuda must say so. Prints "violations: none"
// or "violations:" and simcuda's report.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "rule_check.hpp"

namespace {

cudaStream_t cu(arcpool_stream_t s) {
  return reinterpret_cast<cudaStream_t>(s);
}

/// Later captured work on `to` follows the work captured on `from` so far.
int edge(arcpool_stream_t from, arcpool_stream_t to) {
  cudaEvent_t e = nullptr;
  CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  CHECK(cudaEventRecord(e, cu(from)));
  CHECK(cudaStreamWaitEvent(cu(to), e, 0));
  return cudaEventDestroy(e);
}

}  // namespace

int main() {
  const rule_check::take_fn take = rule_check::violations();
  if (take == nullptr) return 2;
  arcpool_allocator_options_t options;
  arcpool_allocator_options_init(&options);
  options.driver = ARCPOOL_DRIVER_CUDA;
  arcpool_allocator_t* alloc = nullptr;
  CHECK(arcpool_allocator_create(&options, &alloc));
  arcpool_stream_t main_stream = nullptr, branch = nullptr;
  CHECK(arcpool_stream_create(alloc, &main_stream));
  CHECK(arcpool_stream_create(alloc, &branch));
  arcpool_graph_pool_t* pool = nullptr;
  CHECK(arcpool_graph_pool_create(alloc, &pool));

  constexpr size_t kBytes = 1 << 16;
  CHECK(cudaStreamBeginCapture(cu(main_stream), cudaStreamCaptureModeThreadLocal));
  CHECK(arcpool_graph_pool_begin(pool, main_stream));
  CHECK(edge(main_stream, branch));  // fork: the branch runs beside the main stream
  arcpool_allocation_t* a = nullptr;
  CHECK(arcpool_allocate_async(alloc, kBytes, 0, main_stream, 0, &a));
  void* p = nullptr;
  CHECK(arcpool_allocation_data(a, &p));
  CHECK(cudaMemsetAsync(p, 1, kBytes, cu(main_stream)));
  CHECK(arcpool_deallocate_async(a, main_stream, 0));
  CHECK(arcpool_allocation_release(a));
  arcpool_allocation_t* b = nullptr;
  CHECK(arcpool_allocate_async(alloc, kBytes, 0, branch, 0, &b));
  void* q = nullptr;
  CHECK(arcpool_allocation_data(b, &q));
  CHECK(cudaMemsetAsync(q, 2, kBytes, cu(branch)));
  CHECK(arcpool_deallocate_async(b, branch, 0));
  CHECK(arcpool_allocation_release(b));
  CHECK(edge(branch, main_stream));  // join
  cudaGraph_t graph = nullptr;
  CHECK(cudaStreamEndCapture(cu(main_stream), &graph));
  CHECK(arcpool_graph_pool_end(pool, main_stream));
  take(nullptr, 0);  // capture runs nothing: what follows is the replay's

  cudaGraphExec_t exec = nullptr;
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  CHECK(cudaGraphLaunch(exec, cu(main_stream)));
  CHECK(arcpool_stream_synchronize(alloc, main_stream));
  std::vector<char> report;
  const uint64_t found = rule_check::take_report(take, &report);

  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaGraphDestroy(graph));
  CHECK(arcpool_graph_pool_release(pool));
  CHECK(arcpool_stream_destroy(alloc, main_stream));
  CHECK(arcpool_stream_destroy(alloc, branch));
  arcpool_allocator_destroy(alloc);
  take(nullptr, 0);  // what teardown may add is not this check's subject
  rule_check::print_verdict(found, report, p == q ? " (blocks shared)" : " (blocks apart)");
  return 0;
}
