// The PyTorch shim's C functions (python/arcpool_torch.cpp) called in the order PyTorch's
// pluggable allocator calls them, on CUDA streams the shim does not know (torch's). On simcuda,
// whose race checker sees every free that runs before a use; PyTorch itself needs a GPU
// (tests/python/test_torch.py).
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

#include "arcpool/arcpool.h"
#include "conformance/conformance.hpp"

extern "C" {
void* arcpool_torch_malloc(size_t size, int device, cudaStream_t stream);
void arcpool_torch_free(void* ptr, size_t size, int device, cudaStream_t stream);
void arcpool_torch_record_stream(void* ptr, cudaStream_t stream);
void arcpool_torch_empty_cache();
void arcpool_torch_set_memory_fraction(double fraction, int device);
void arcpool_torch_begin_allocate_to_pool(int device,
                                          std::pair<unsigned long long, unsigned long long> id,
                                          std::function<bool(cudaStream_t)> filter);
void arcpool_torch_end_allocate_to_pool(int device,
                                        std::pair<unsigned long long, unsigned long long> id);
void arcpool_torch_release_pool(int device, std::pair<unsigned long long, unsigned long long> id);
arcpool_status_t arcpool_torch_capture_stream_begin(int device, cudaStream_t stream);
arcpool_status_t arcpool_torch_capture_stream_end(int device, cudaStream_t stream);
}

namespace conformance {
namespace {

using TorchShim = Conformance;

TEST_F(TorchShim, RecordStreamCoversSideWorkQueuedBeforeTheFree) {
  CONFORMANCE_SIMCUDA_ONLY();
  // Tensor.record_stream: no reuse until the side stream's work queued at deallocation time
  // has completed, including work queued after record_stream.
  words w;
  cudaStream_t main_stream = nullptr, side = nullptr;
  ASSERT_EQ(cudaSuccess, cudaStreamCreateWithFlags(&main_stream, cudaStreamNonBlocking));
  ASSERT_EQ(cudaSuccess, cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  constexpr size_t kBytes = 1 << 20;
  void* p = arcpool_torch_malloc(kBytes, 0, main_stream);
  ASSERT_NE(nullptr, p);
  ASSERT_EQ(cudaSuccess, cudaStreamSynchronize(main_stream));  // side's use follows it
  arcpool_torch_record_stream(p, side);
  w.gate(side, 0);
  ASSERT_EQ(cudaSuccess, cudaMemsetAsync(p, 1, kBytes, side));  // after record_stream
  arcpool_torch_free(p, kBytes, 0, main_stream);  // PyTorch frees on the allocation stream
  w.settle();  // a free that did not wait for the memset would be queued by now
  w.open(0);
  ASSERT_EQ(cudaSuccess, cudaStreamSynchronize(side));
  arcpool_torch_empty_cache();  // completes the deferred free
  EXPECT_EQ("", take_simcuda_violations());
  cudaStreamDestroy(main_stream);
  cudaStreamDestroy(side);
}

/// Device 0's memory that no pool or allocation holds (cudaMemGetInfo's free bytes).
size_t free_memory() {
  size_t free_bytes = 0, total = 0;
  EXPECT_EQ(cudaSuccess, cudaMemGetInfo(&free_bytes, &total));
  return free_bytes;
}

TEST_F(TorchShim, EmptyCacheGivesBackMemoryFreedOnTorchsStreams) {
  CONFORMANCE_SIMCUDA_ONLY();
  // torch.cuda.empty_cache after a tensor on one of torch's streams died: cudaMemPoolTrimTo
  // keeps frees the host has not seen complete, and arcpool cannot synchronize torch's streams
  // (it does not know them), so the shim synchronizes the device first, as PyTorch does.
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaSuccess, cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  constexpr size_t kBytes = size_t{64} << 20;  // above the stream caches' largest block
  arcpool_torch_empty_cache();
  const size_t before = free_memory();
  void* p = arcpool_torch_malloc(kBytes, 0, s);
  ASSERT_NE(nullptr, p);
  ASSERT_EQ(cudaSuccess, cudaMemsetAsync(p, 1, kBytes, s));
  EXPECT_LE(free_memory() + kBytes, before);
  arcpool_torch_free(p, kBytes, 0, s);
  arcpool_torch_empty_cache();
  EXPECT_GE(free_memory(), before) << "memory freed on torch's stream stayed reserved";
  EXPECT_EQ("", take_simcuda_violations());
  cudaStreamDestroy(s);
}

TEST_F(TorchShim, EmptyCacheDuringACaptureRaisesAsPyTorchsOwnDoes) {
  CONFORMANCE_SIMCUDA_ONLY();
  // PyTorch's cudaMallocAsync backend: C10_CUDA_CHECK(cudaDeviceSynchronize()) raises while a
  // stream captures. The shim's synchronization fails the same way, and said nothing.
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaSuccess, cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  void* p = arcpool_torch_malloc(4096, 0, s);  // the shim has used device 0
  ASSERT_NE(nullptr, p);
  ASSERT_EQ(cudaSuccess, cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
  try {
    arcpool_torch_empty_cache();
    ADD_FAILURE() << "empty_cache during a capture returned as if it had trimmed";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(nullptr, std::strstr(e.what(), "empty_cache failed")) << e.what();
  }
  cudaGraph_t graph = nullptr;
  EXPECT_EQ(cudaErrorStreamCaptureInvalidated, cudaStreamEndCapture(s, &graph));
  arcpool_torch_free(p, 4096, 0, s);
  arcpool_torch_empty_cache();
  EXPECT_EQ("", take_simcuda_violations());
  cudaStreamDestroy(s);
}

TEST_F(TorchShim, AMemoryFractionOfZeroAllowsNoNewMemory) {
  CONFORMANCE_SIMCUDA_ONLY();
  // torch.cuda.set_per_process_memory_fraction(0.0): PyTorch's own allocator then fails every
  // allocation that needs new memory. arcpool's hard limit of 0 would mean no limit at all.
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaSuccess, cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  arcpool_torch_empty_cache();  // nothing cached from earlier tests
  arcpool_torch_set_memory_fraction(0.0, 0);
  EXPECT_THROW(arcpool_torch_malloc(size_t{1} << 20, 0, s), std::runtime_error);
  arcpool_torch_set_memory_fraction(1.0, 0);
  void* p = arcpool_torch_malloc(size_t{1} << 20, 0, s);
  EXPECT_NE(nullptr, p);
  arcpool_torch_free(p, size_t{1} << 20, 0, s);
  ASSERT_EQ(cudaSuccess, cudaStreamSynchronize(s));
  cudaStreamDestroy(s);
}

/// Device 0's default allocator's statistics (the allocator the shim serves).
arcpool_stats_t device0_stats() {
  arcpool_allocator_t* a = nullptr;
  EXPECT_EQ(ARCPOOL_STATUS_SUCCESS, arcpool_default_allocator_get(0, &a));
  arcpool_stats_t st{};
  st.struct_size = sizeof(st);
  st.version = ARCPOOL_STATS_VERSION;
  EXPECT_EQ(ARCPOOL_STATUS_SUCCESS, arcpool_stats_get(a, &st));
  return st;
}

/// Waits (up to 10 s) until device 0's graph pools hold `bytes`: a released pool's memory goes
/// back on the reclaim worker.
bool graph_pool_bytes_reach(uint64_t bytes) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (device0_stats().graph_pool_bytes_current != bytes &&
         std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return device0_stats().graph_pool_bytes_current == bytes;
}

/// Bytes device 0's allocator holds outside its stream caches and graph pools: live
/// allocations and blocks whose free has not run yet.
uint64_t outside_pools(const arcpool_stats_t& st) {
  return st.bytes_held_current - st.bytes_cached_current - st.graph_pool_bytes_current;
}

using torch_mempool_id = std::pair<unsigned long long, unsigned long long>;
constexpr size_t kStepBytes = size_t{1} << 20;

/// torch.cuda.graph's begin on `s` into PyTorch's pool `pool`: arcpool.torch's registration of
/// `s`, beginAllocateToPool with a filter that claims the streams of this capture (as
/// CUDAGraph::capture_begin's does, by cudaStreamGetCaptureInfo's id), the capture's begin.
void begin_torch_capture(cudaStream_t s, torch_mempool_id pool) {
  EXPECT_EQ(ARCPOOL_STATUS_SUCCESS, arcpool_torch_capture_stream_begin(0, s));
  auto capture_id = std::make_shared<unsigned long long>(0);  // CUDAGraph::capture_id_
  arcpool_torch_begin_allocate_to_pool(0, pool, [capture_id](cudaStream_t stream) {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    unsigned long long id = 0;
    if (cudaStreamGetCaptureInfo(stream, &status, &id) != cudaSuccess) {
      throw std::runtime_error("cudaStreamGetCaptureInfo failed");
    }
    return status == cudaStreamCaptureStatusActive && id == *capture_id;
  });
  EXPECT_EQ(cudaSuccess, cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  EXPECT_EQ(cudaSuccess, cudaStreamGetCaptureInfo(s, &status, capture_id.get()));
}

/// One torch.cuda.graph capture on `s` into PyTorch's pool `pool`, call by call: arcpool.torch
/// registers the capture stream (its wrapper of CUDAGraph.capture_begin); capture_begin calls
/// beginAllocateToPool with a filter that asks cudaStreamGetCaptureInfo, as CUDAGraph's does,
/// then begins the capture; the step allocates an output and copies `input` into it (through a
/// temporary it frees in the capture, with `temporary`); capture_end ends the capture, then
/// calls endAllocateToPool. Returns the graph and sets `*out` to the output, which outlives it.
cudaGraph_t capture_step(cudaStream_t s, torch_mempool_id pool, const void* input, void** out,
                         bool temporary = true) {
  begin_torch_capture(s, pool);
  void* tmp = temporary ? arcpool_torch_malloc(kStepBytes, 0, s) : nullptr;
  if (tmp != nullptr) {
    EXPECT_EQ(cudaSuccess, cudaMemcpyAsync(tmp, input, kStepBytes, cudaMemcpyDeviceToDevice, s));
  }
  *out = arcpool_torch_malloc(kStepBytes, 0, s);
  EXPECT_EQ(cudaSuccess, cudaMemcpyAsync(*out, tmp != nullptr ? tmp : input, kStepBytes,
                                         cudaMemcpyDeviceToDevice, s));
  if (tmp != nullptr) arcpool_torch_free(tmp, kStepBytes, 0, s);  // dies inside the capture
  cudaGraph_t graph = nullptr;
  EXPECT_EQ(cudaSuccess, cudaStreamEndCapture(s, &graph));
  arcpool_torch_end_allocate_to_pool(0, pool);
  EXPECT_EQ(ARCPOOL_STATUS_SUCCESS, arcpool_torch_capture_stream_end(0, s));
  return graph;
}

/// Replays `graph` (instantiated with auto-free-on-launch, as CUDAGraph does) three times after
/// writing a new value into `input`, and expects each in `out`.
void replay_step(cudaGraph_t graph, cudaStream_t s, void* input, const void* out) {
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaSuccess,
            cudaGraphInstantiateWithFlags(&exec, graph, cudaGraphInstantiateFlagAutoFreeOnLaunch));
  std::vector<unsigned char> host(kStepBytes);
  for (int replay = 0; replay < 3; ++replay) {
    ASSERT_EQ(cudaSuccess, cudaMemsetAsync(input, 10 + replay, kStepBytes, s));
    ASSERT_EQ(cudaSuccess, cudaGraphLaunch(exec, s));
    ASSERT_EQ(cudaSuccess,
              cudaMemcpyAsync(host.data(), out, kStepBytes, cudaMemcpyDeviceToHost, s));
    ASSERT_EQ(cudaSuccess, cudaStreamSynchronize(s));
    EXPECT_EQ(10 + replay, host[0]) << "replay " << replay;
    EXPECT_EQ(10 + replay, host[kStepBytes - 1]) << "replay " << replay;
  }
  ASSERT_EQ(cudaSuccess, cudaGraphExecDestroy(exec));
}

TEST_F(TorchShim, AGraphCapturedThroughPyTorchsPoolHooksAllocatesFromItsGraphPool) {
  CONFORMANCE_SIMCUDA_ONLY();
  // torch.cuda.graph(g), then replays, the output tensor's death and the graph's reset
  // (releasePool): the step's allocations are blocks of an arcpool graph pool, reserved outside
  // the capture, and the pool's memory goes back once the graph is gone and the pool released.
  const torch_mempool_id pool{0, 7};
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaSuccess, cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  void* x = arcpool_torch_malloc(kStepBytes, 0, s);  // a tensor made before the capture
  ASSERT_NE(nullptr, x);
  const arcpool_stats_t before = device0_stats();
  void* out = nullptr;
  cudaGraph_t graph = capture_step(s, pool, x, &out);
  ASSERT_NE(nullptr, graph);
  const arcpool_stats_t captured = device0_stats();
  EXPECT_EQ(before.graph_pool_bytes_current + 2 * kStepBytes, captured.graph_pool_bytes_current)
      << "the capture's allocations did not come from a graph pool";
  EXPECT_EQ(before.graph_frees + 1, captured.graph_frees) << "the temporary";
  replay_step(graph, s, x, out);
  arcpool_torch_free(out, kStepBytes, 0, s);  // the output tensor dies after the replays
  arcpool_torch_free(x, kStepBytes, 0, s);
  EXPECT_EQ(before.graph_pool_bytes_current + 2 * kStepBytes,
            device0_stats().graph_pool_bytes_current)
      << "the graph still exists: its pool keeps its memory";
  ASSERT_EQ(cudaSuccess, cudaGraphDestroy(graph));
  arcpool_torch_release_pool(0, pool);  // CUDAGraph::reset
  EXPECT_TRUE(graph_pool_bytes_reach(before.graph_pool_bytes_current))
      << "the released pool kept its memory";
  EXPECT_EQ("", take_simcuda_violations());
  cudaStreamDestroy(s);
}

TEST_F(TorchShim, ASecondCaptureRecordingToAnOpenPoolIsRefused) {
  CONFORMANCE_SIMCUDA_ONLY();
  // PyTorch's own allocator lets one capture at a time record to a pool ("already recording to
  // mempool_id"): the end hook names only the pool, so two open captures could not be told
  // apart. The second begin raises; once the first capture's end came, the pool takes another.
  const torch_mempool_id pool{0, 9};
  arcpool_torch_begin_allocate_to_pool(0, pool, [](cudaStream_t) { return false; });
  EXPECT_THROW(arcpool_torch_begin_allocate_to_pool(0, pool, [](cudaStream_t) { return true; }),
               std::runtime_error);
  arcpool_torch_end_allocate_to_pool(0, pool);
  EXPECT_NO_THROW(
      arcpool_torch_begin_allocate_to_pool(0, pool, [](cudaStream_t) { return false; }));
  arcpool_torch_end_allocate_to_pool(0, pool);
  arcpool_torch_release_pool(0, pool);  // one release per accepted begin
  arcpool_torch_release_pool(0, pool);
  EXPECT_EQ("", take_simcuda_violations());
}

TEST_F(TorchShim, GraphsSharingAPoolShareItsMemoryUntilTheLastIsReset) {
  CONFORMANCE_SIMCUDA_ONLY();
  // torch.cuda.graph(g2, pool=g1.pool()): every beginAllocateToPool of a pool is matched by one
  // releasePool. After g1's reset, g2 still holds the pool, so a third capture into it is
  // served by the same graph pool, and reuses g1's output block, freed outside the captures
  // once its work completed, rather than growing. (The steps free no temporary in their
  // captures: such a block returns on the reclaim worker once its graph is gone, at a time
  // the test cannot see.)
  const torch_mempool_id pool{0, 9};
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaSuccess, cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  void* x = arcpool_torch_malloc(kStepBytes, 0, s);
  ASSERT_NE(nullptr, x);
  const uint64_t before = device0_stats().graph_pool_bytes_current;
  void* out1 = nullptr;
  void* out2 = nullptr;
  void* out3 = nullptr;
  cudaGraph_t g1 = capture_step(s, pool, x, &out1, /*temporary=*/false);
  cudaGraph_t g2 = capture_step(s, pool, x, &out2, /*temporary=*/false);
  ASSERT_NE(nullptr, g1);
  ASSERT_NE(nullptr, g2);
  arcpool_torch_free(out1, kStepBytes, 0, s);  // g1's output dies, then g1 itself
  ASSERT_EQ(cudaSuccess, cudaStreamSynchronize(s));
  ASSERT_EQ(cudaSuccess, cudaGraphDestroy(g1));
  arcpool_torch_release_pool(0, pool);  // g1's reset
  const uint64_t two_graphs = device0_stats().graph_pool_bytes_current;
  EXPECT_EQ(before + 2 * kStepBytes, two_graphs) << "g1's block stays in the pool g2 holds";
  cudaGraph_t g3 = capture_step(s, pool, x, &out3, /*temporary=*/false);
  ASSERT_NE(nullptr, g3);
  EXPECT_EQ(two_graphs, device0_stats().graph_pool_bytes_current)
      << "the third capture was not served from g1's free block of the shared pool";
  replay_step(g3, s, x, out3);
  replay_step(g2, s, x, out2);
  arcpool_torch_free(out2, kStepBytes, 0, s);
  arcpool_torch_free(out3, kStepBytes, 0, s);
  arcpool_torch_free(x, kStepBytes, 0, s);
  ASSERT_EQ(cudaSuccess, cudaGraphDestroy(g2));
  ASSERT_EQ(cudaSuccess, cudaGraphDestroy(g3));
  arcpool_torch_release_pool(0, pool);  // g2's reset
  arcpool_torch_release_pool(0, pool);  // g3's reset
  EXPECT_TRUE(graph_pool_bytes_reach(before)) << "the pool outlived its graphs";
  EXPECT_EQ("", take_simcuda_violations());
  cudaStreamDestroy(s);
}

TEST_F(TorchShim, ATensorFromBeforeTheCaptureFreedInItIsFreedOnceTheGraphIsGone) {
  CONFORMANCE_SIMCUDA_ONLY();
  // A captured step that drops a tensor made before the capture (x = f(x) in the step): PyTorch
  // frees it on the capture stream while it captures. Each replay still reads it, so its free
  // waits for the graph's end, after the stream's registration for the capture is withdrawn;
  // a large output makes the graph pool grow during the capture.
  const torch_mempool_id pool{0, 11};
  constexpr size_t kLarge = size_t{64} << 20;  // above the stream caches' largest block
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaSuccess, cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  void* x = arcpool_torch_malloc(kStepBytes, 0, s);
  ASSERT_NE(nullptr, x);
  ASSERT_EQ(cudaSuccess, cudaMemsetAsync(x, 3, kStepBytes, s));
  const arcpool_stats_t before = device0_stats();
  ASSERT_EQ(ARCPOOL_STATUS_SUCCESS, arcpool_torch_capture_stream_begin(0, s));
  auto capture_id = std::make_shared<unsigned long long>(0);
  arcpool_torch_begin_allocate_to_pool(0, pool, [capture_id](cudaStream_t stream) {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    unsigned long long id = 0;
    return cudaStreamGetCaptureInfo(stream, &status, &id) == cudaSuccess &&
           status == cudaStreamCaptureStatusActive && id == *capture_id;
  });
  ASSERT_EQ(cudaSuccess, cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  ASSERT_EQ(cudaSuccess, cudaStreamGetCaptureInfo(s, &status, capture_id.get()));
  void* out = arcpool_torch_malloc(kLarge, 0, s);
  ASSERT_NE(nullptr, out);
  ASSERT_EQ(cudaSuccess, cudaMemcpyAsync(out, x, kStepBytes, cudaMemcpyDeviceToDevice, s));
  arcpool_torch_free(x, kStepBytes, 0, s);  // x's last reference goes inside the step
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaSuccess, cudaStreamEndCapture(s, &graph));
  arcpool_torch_end_allocate_to_pool(0, pool);
  ASSERT_EQ(ARCPOOL_STATUS_SUCCESS, arcpool_torch_capture_stream_end(0, s));
  const arcpool_stats_t captured = device0_stats();
  EXPECT_EQ(before.graph_deferred_frees + 1, captured.graph_deferred_frees);
  EXPECT_GE(captured.graph_pool_bytes_current, before.graph_pool_bytes_current + kLarge);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaSuccess,
            cudaGraphInstantiateWithFlags(&exec, graph, cudaGraphInstantiateFlagAutoFreeOnLaunch));
  unsigned char first = 0;
  for (int replay = 0; replay < 3; ++replay) {
    ASSERT_EQ(cudaSuccess, cudaGraphLaunch(exec, s));
    ASSERT_EQ(cudaSuccess, cudaMemcpyAsync(&first, out, 1, cudaMemcpyDeviceToHost, s));
    ASSERT_EQ(cudaSuccess, cudaStreamSynchronize(s));
    EXPECT_EQ(3, first) << "replay " << replay << " read x after its free";
  }
  EXPECT_EQ(outside_pools(before), outside_pools(device0_stats()))
      << "x was freed while its graph could still be launched";
  arcpool_torch_free(out, kLarge, 0, s);
  ASSERT_EQ(cudaSuccess, cudaGraphExecDestroy(exec));
  ASSERT_EQ(cudaSuccess, cudaGraphDestroy(graph));
  arcpool_torch_release_pool(0, pool);
  EXPECT_TRUE(graph_pool_bytes_reach(before.graph_pool_bytes_current));
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (outside_pools(device0_stats()) != outside_pools(before) - kStepBytes &&
         std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(outside_pools(before) - kStepBytes, outside_pools(device0_stats()))
      << "x's deferred free never completed";
  EXPECT_EQ(0u, device0_stats().reclaim_failures);
  EXPECT_EQ("", take_simcuda_violations());
  cudaStreamDestroy(s);
}

TEST_F(TorchShim, APoolsFilterClaimingAStreamThatDoesNotCaptureGetsOrdinaryMemory) {
  CONFORMANCE_SIMCUDA_ONLY();
  // torch.cuda.use_mem_pool outside a capture calls beginAllocateToPool with a filter that
  // claims the thread's streams, none capturing: graph pools lend only to captures, so the
  // allocation gets arcpool's ordinary memory, and nothing raises.
  const torch_mempool_id pool{0, 10};
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaSuccess, cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const uint64_t before = device0_stats().graph_pool_bytes_current;
  arcpool_torch_begin_allocate_to_pool(0, pool, [](cudaStream_t) { return true; });
  void* p = nullptr;
  EXPECT_NO_THROW(p = arcpool_torch_malloc(4096, 0, s));
  EXPECT_NE(nullptr, p);
  EXPECT_EQ(before, device0_stats().graph_pool_bytes_current);
  arcpool_torch_free(p, 4096, 0, s);
  arcpool_torch_end_allocate_to_pool(0, pool);
  arcpool_torch_release_pool(0, pool);
  ASSERT_EQ(cudaSuccess, cudaStreamSynchronize(s));
  EXPECT_EQ("", take_simcuda_violations());
  cudaStreamDestroy(s);
}

/// Makes later work captured on `to` follow the work captured on `from` so far (a fork or a
/// join, as torch.cuda.Stream.wait_stream).
void wait_stream(cudaStream_t to, cudaStream_t from) {
  cudaEvent_t e = nullptr;
  ASSERT_EQ(cudaSuccess, cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  ASSERT_EQ(cudaSuccess, cudaEventRecord(e, from));
  ASSERT_EQ(cudaSuccess, cudaStreamWaitEvent(to, e, 0));
  cudaEventDestroy(e);
}

TEST_F(TorchShim, ASideStreamTheCaptureForksToAllocatesFromTheGraphPool) {
  CONFORMANCE_SIMCUDA_ONLY();
  // torch.cuda.graph with a side stream (side.wait_stream(s); with torch.cuda.stream(side):
  // ...; s.wait_stream(side)): arcpool.torch registers only the capture stream, and the side
  // stream's temporary comes from the graph pool too (it raised UNSUPPORTED).
  const torch_mempool_id pool{0, 9};
  cudaStream_t s = nullptr, side = nullptr;
  ASSERT_EQ(cudaSuccess, cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  ASSERT_EQ(cudaSuccess, cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  void* x = arcpool_torch_malloc(kStepBytes, 0, s);
  ASSERT_NE(nullptr, x);
  const arcpool_stats_t before = device0_stats();
  begin_torch_capture(s, pool);
  wait_stream(side, s);  // fork
  void* tmp = nullptr;
  ASSERT_NO_THROW(tmp = arcpool_torch_malloc(kStepBytes, 0, side));
  ASSERT_EQ(cudaSuccess, cudaMemcpyAsync(tmp, x, kStepBytes, cudaMemcpyDeviceToDevice, side));
  wait_stream(s, side);  // join
  void* out = arcpool_torch_malloc(kStepBytes, 0, s);
  ASSERT_EQ(cudaSuccess, cudaMemcpyAsync(out, tmp, kStepBytes, cudaMemcpyDeviceToDevice, s));
  arcpool_torch_record_stream(tmp, s);  // tmp.record_stream(s): its free follows the copy
  arcpool_torch_free(tmp, kStepBytes, 0, side);
  wait_stream(s, side);  // the side stream's last captured work, joined
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaSuccess, cudaStreamEndCapture(s, &graph));
  arcpool_torch_end_allocate_to_pool(0, pool);
  ASSERT_EQ(ARCPOOL_STATUS_SUCCESS, arcpool_torch_capture_stream_end(0, s));
  EXPECT_EQ(before.graph_pool_bytes_current + 2 * kStepBytes,
            device0_stats().graph_pool_bytes_current)
      << "the side stream's temporary did not come from the graph pool";
  replay_step(graph, s, x, out);
  arcpool_torch_free(out, kStepBytes, 0, s);
  arcpool_torch_free(x, kStepBytes, 0, s);
  ASSERT_EQ(cudaSuccess, cudaGraphDestroy(graph));
  arcpool_torch_release_pool(0, pool);
  EXPECT_TRUE(graph_pool_bytes_reach(before.graph_pool_bytes_current))
      << "the released pool kept its memory";
  EXPECT_EQ("", take_simcuda_violations());
  cudaStreamDestroy(side);
  cudaStreamDestroy(s);
}

/// x = torch.empty(...) on a new stream, then x.record_stream(side) for another new stream: the
/// set-up of a free that waits on `side`. The streams go with it.
struct memory_recorded_for_a_side_stream {
  cudaStream_t main_stream = nullptr;
  cudaStream_t side = nullptr;
  void* p = nullptr;
  uint64_t in_use = 0;  ///< device 0's bytes in use once `p` was allocated and recorded

  memory_recorded_for_a_side_stream() {
    EXPECT_EQ(cudaSuccess, cudaStreamCreateWithFlags(&main_stream, cudaStreamNonBlocking));
    EXPECT_EQ(cudaSuccess, cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
    p = arcpool_torch_malloc(kStepBytes, 0, main_stream);
    EXPECT_EQ(cudaSuccess, cudaStreamSynchronize(main_stream));
    if (p != nullptr) arcpool_torch_record_stream(p, side);
    in_use = device0_stats().bytes_in_use_current;
  }
  ~memory_recorded_for_a_side_stream() {
    cudaStreamDestroy(main_stream);
    cudaStreamDestroy(side);
  }
  memory_recorded_for_a_side_stream(const memory_recorded_for_a_side_stream&) = delete;
  memory_recorded_for_a_side_stream& operator=(const memory_recorded_for_a_side_stream&) = delete;
};

TEST_F(TorchShim, AFreeWaitingOnACapturingStreamIsMadeOnceTheCaptureEnded) {
  CONFORMANCE_SIMCUDA_ONLY();
  // x.record_stream(side), then x dies while side captures a graph: arcpool cannot fence a
  // capturing stream and refuses the free (UNSUPPORTED), which PyTorch's free hook cannot take
  // (PyTorch's own allocator defers such a free until no capture is under way). The shim keeps
  // it and makes it again after the capture; it was reported on stderr and never made.
  memory_recorded_for_a_side_stream x;
  ASSERT_NE(nullptr, x.p);
  ASSERT_EQ(cudaSuccess, cudaStreamBeginCapture(x.side, cudaStreamCaptureModeRelaxed));
  testing::internal::CaptureStderr();  // no ASSERT until it is read back
  arcpool_torch_free(x.p, kStepBytes, 0, x.main_stream);
  cudaGraph_t graph = nullptr;
  EXPECT_EQ(cudaSuccess, cudaStreamEndCapture(x.side, &graph));
  EXPECT_EQ(cudaSuccess, cudaGraphDestroy(graph));
  arcpool_torch_empty_cache();
  EXPECT_EQ("", testing::internal::GetCapturedStderr());
  EXPECT_EQ(x.in_use - kStepBytes, device0_stats().bytes_in_use_current) << "the free was lost";
  EXPECT_EQ("", take_simcuda_violations());
}

TEST_F(TorchShim, AFreeHeldBackByATorchCaptureIsMadeWhenTheCaptureEnds) {
  CONFORMANCE_SIMCUDA_ONLY();
  // The same through torch.cuda.graph: the stream recorded for the memory is the capture's, and
  // the free is made at endAllocateToPool, after cudaStreamEndCapture.
  const torch_mempool_id pool{0, 11};
  memory_recorded_for_a_side_stream x;
  ASSERT_NE(nullptr, x.p);
  begin_torch_capture(x.side, pool);
  arcpool_torch_free(x.p, kStepBytes, 0, x.main_stream);  // refused while side captures: kept
  EXPECT_EQ(x.in_use, device0_stats().bytes_in_use_current) << "freed while side captured";
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaSuccess, cudaStreamEndCapture(x.side, &graph));
  arcpool_torch_end_allocate_to_pool(0, pool);
  EXPECT_EQ(x.in_use - kStepBytes, device0_stats().bytes_in_use_current)
      << "the held-back free was not made at the capture's end";
  EXPECT_EQ(ARCPOOL_STATUS_SUCCESS, arcpool_torch_capture_stream_end(0, x.side));
  ASSERT_EQ(cudaSuccess, cudaGraphDestroy(graph));
  arcpool_torch_release_pool(0, pool);
  EXPECT_EQ("", take_simcuda_violations());
}

TEST_F(TorchShim, AnEndRefusedWhileTheCaptureGoesOnKeepsTheCaptureStream) {
  CONFORMANCE_SIMCUDA_ONLY();
  // PyTorch's capture_end refuses to end a capture from another stream than it began on, and
  // the capture goes on; arcpool.torch then withdraws the registration, which arcpool refuses
  // while the stream captures. The stream stays a capture stream the capture binds on: a side
  // stream the capture forks to still allocates from the graph pool.
  const torch_mempool_id pool{0, 10};
  cudaStream_t s = nullptr, side = nullptr;
  ASSERT_EQ(cudaSuccess, cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  ASSERT_EQ(cudaSuccess, cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  begin_torch_capture(s, pool);
  EXPECT_EQ(ARCPOOL_STATUS_UNSUPPORTED, arcpool_torch_capture_stream_end(0, s));
  wait_stream(side, s);  // fork
  void* tmp = nullptr;
  EXPECT_NO_THROW(tmp = arcpool_torch_malloc(kStepBytes, 0, side));
  if (tmp != nullptr) arcpool_torch_free(tmp, kStepBytes, 0, side);
  wait_stream(s, side);  // join
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaSuccess, cudaStreamEndCapture(s, &graph));
  arcpool_torch_end_allocate_to_pool(0, pool);
  EXPECT_EQ(ARCPOOL_STATUS_SUCCESS, arcpool_torch_capture_stream_end(0, s));
  ASSERT_EQ(cudaSuccess, cudaGraphDestroy(graph));
  arcpool_torch_release_pool(0, pool);
  EXPECT_EQ("", take_simcuda_violations());
  cudaStreamDestroy(side);
  cudaStreamDestroy(s);
}

TEST_F(TorchShim, ACaptureOnAStreamArcpoolWasNotToldOfRaisesUnsupported) {
  CONFORMANCE_SIMCUDA_ONLY();
  // Without arcpool.torch's registration of the capture stream (a capture PyTorch's CUDAGraph
  // did not begin), arcpool cannot tell the capturing stream, and the allocation raises with
  // its UNSUPPORTED message, the pool hooks notwithstanding: nothing bound the capture to a
  // graph pool on a stream arcpool knows (the binding itself is refused).
  const std::pair<unsigned long long, unsigned long long> pool_id{0, 8};
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaSuccess, cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  arcpool_torch_begin_allocate_to_pool(0, pool_id, [](cudaStream_t) { return true; });
  ASSERT_EQ(cudaSuccess, cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
  try {
    arcpool_torch_malloc(4096, 0, s);
    ADD_FAILURE() << "an allocation on an unknown capturing stream succeeded";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(nullptr, std::strstr(e.what(), "UNSUPPORTED")) << e.what();
  }
  cudaGraph_t graph = nullptr;
  EXPECT_EQ(cudaSuccess, cudaStreamEndCapture(s, &graph));
  arcpool_torch_end_allocate_to_pool(0, pool_id);
  arcpool_torch_release_pool(0, pool_id);
  if (graph != nullptr) cudaGraphDestroy(graph);
  EXPECT_EQ("", take_simcuda_violations());
  cudaStreamDestroy(s);
}

}  // namespace
}  // namespace conformance
