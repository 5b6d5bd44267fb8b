// Allocation and deallocation during CUDA graph capture (docs/graphs.md), on the CUDA driver:
// on simcuda in CI, on a GPU when there is one. The host drivers build no graphs and keep
// answering UNSUPPORTED (Errors.ACapturingStreamIsUnsupportedAndNothingChanges).
#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <future>
#include <thread>
#include <utility>

#include "arcpool/arcpool.h"
#include "arcpool/arcpool.hpp"
#include "support/driver_test.hpp"
#include "support/simcuda_probe.hpp"

namespace arcpool::test {
namespace {

constexpr size_t kBytes = 4096;

cudaStream_t cu(arcpool_stream_t s) {
  return reinterpret_cast<cudaStream_t>(s);
}

/// The CUDA driver with its per-stream cache on (the fixture turns it off by default).
class GraphCapture : public DriverTest {
 protected:
  void customize(arcpool_allocator_options_t& options) override {
    options.stream_cache_bytes = size_t{1} << 20;
  }
  void TearDown() override {
    if (const std::string v = take_simcuda_violations(); !v.empty()) {
      ADD_FAILURE() << "simcuda violations:\n" << v;
    }
    DriverTest::TearDown();
  }

  void begin(arcpool_stream_t s) {
    ASSERT_EQ(cudaSuccess, cudaStreamBeginCapture(cu(s), cudaStreamCaptureModeThreadLocal));
  }
  cudaGraph_t end(arcpool_stream_t s) {
    cudaGraph_t graph = nullptr;
    EXPECT_EQ(cudaSuccess, cudaStreamEndCapture(cu(s), &graph));
    return graph;
  }
  /// Makes later captured work on `to` follow the work captured on `from` so far.
  void edge(arcpool_stream_t from, arcpool_stream_t to) {
    cudaEvent_t e = nullptr;
    ASSERT_EQ(cudaSuccess, cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    ASSERT_EQ(cudaSuccess, cudaEventRecord(e, cu(from)));
    ASSERT_EQ(cudaSuccess, cudaStreamWaitEvent(cu(to), e, 0));
    cudaEventDestroy(e);
  }
  cudaGraphExec_t instantiate(cudaGraph_t graph) {
    cudaGraphExec_t exec = nullptr;
    EXPECT_EQ(cudaSuccess, cudaGraphInstantiate(&exec, graph, 0));
    return exec;
  }
  /// Waits (at most 10 s) until every user object arcpool armed has run its destructor and the
  /// task it posted has run to its end: CUDA runs destructors on a thread of its own.
  void await_posted_tasks() {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (core().reclaims().posts_outstanding() && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    ASSERT_FALSE(core().reclaims().posts_outstanding()) << "a user object's destructor never ran";
  }
  /// Completes the deferred frees and expects nothing held but the stream caches.
  void finish_and_expect_nothing_held() {
    finish_reclaims();
    EXPECT_EQ(0u, stats().bytes_held_current - stats().bytes_cached_current);
  }
  bool is_graph_memory(const arcpool_allocation_t* a) const {
    return (placement(a).flags & ARCPOOL_PLACEMENT_FLAG_GRAPH) != 0;
  }
};

/// Another thread capturing `s` in global mode, which prohibits potentially unsafe calls on
/// every thread, from construction until end(); `inside` runs in the capture first.
class global_capture {
 public:
  explicit global_capture(arcpool_stream_t s, std::function<void()> inside = {})
      : thread_([this, s, inside = std::move(inside)] {
          cudaSetDevice(0);
          EXPECT_EQ(cudaSuccess, cudaStreamBeginCapture(cu(s), cudaStreamCaptureModeGlobal));
          if (inside) inside();
          step_ = 1;
          while (step_.load() != 2)
            std::this_thread::yield();
          cudaGraph_t graph = nullptr;
          ended_ = cudaStreamEndCapture(cu(s), &graph);
          if (graph != nullptr) cudaGraphDestroy(graph);
        }) {
    while (step_.load() != 1)
      std::this_thread::yield();
  }
  /// Ends the capture if end() did not (a test that stopped at a failed assertion).
  ~global_capture() {
    if (thread_.joinable()) end();
  }
  global_capture(const global_capture&) = delete;
  global_capture& operator=(const global_capture&) = delete;

  /// Ends the capture and returns cudaStreamEndCapture's result: cudaErrorStreamCaptureInvalidated
  /// if a call in the meantime broke it.
  cudaError_t end() {
    step_ = 2;
    thread_.join();
    return ended_;
  }

 private:
  std::atomic<int> step_{0};
  cudaError_t ended_ = cudaErrorUnknown;
  std::thread thread_;
};

/// Page-locked bytes a graph copies into, for the host to verify after each launch.
struct host_bytes {
  unsigned char* p = nullptr;
  host_bytes() {
    void* v = nullptr;
    EXPECT_EQ(cudaSuccess, cudaHostAlloc(&v, kBytes, cudaHostAllocMapped));
    p = static_cast<unsigned char*>(v);
  }
  ~host_bytes() { cudaFreeHost(p); }
  bool all(unsigned char v) const {
    for (size_t i = 0; i < kBytes; ++i)
      if (p[i] != v) return false;
    return true;
  }
};

TEST_P(GraphCapture, AProducerConsumerPipelineReplays100TimesWithItsFreeInTheGraph) {
  arcpool_stream_t producer = make_stream(), consumer = make_stream();
  host_bytes host;
  const arcpool_stats_t before = stats();
  begin(producer);
  arcpool_allocation_t* a = allocate(kBytes, producer);
  EXPECT_TRUE(is_graph_memory(a));
  fill_async(producer, data(a), kBytes, 7);
  edge(producer, consumer);  // fork: the consumer reads what the producer wrote
  ASSERT_EQ(cudaSuccess, cudaMemcpyAsync(host.p, data(a), kBytes, cudaMemcpyDefault, cu(consumer)));
  edge(consumer, producer);  // join: the free follows the read
  ASSERT_OK(arcpool_deallocate_async(a, producer, 0));
  arcpool_allocation_release(a);
  cudaGraph_t graph = end(producer);
  ASSERT_NE(nullptr, graph);
  const arcpool_stats_t captured = stats();
  EXPECT_EQ(before.graph_allocations + 1, captured.graph_allocations);
  EXPECT_EQ(before.graph_frees + 1, captured.graph_frees);
  EXPECT_EQ(0u, captured.graph_bytes_in_use_current);
  EXPECT_EQ(kBytes, captured.graph_bytes_in_use_peak);
  EXPECT_EQ(before.bytes_held_current, captured.bytes_held_current) << "not the pool's memory";
  cudaGraphExec_t exec = instantiate(graph);
  for (int launch = 0; launch < 100; ++launch) {
    std::memset(host.p, 0, kBytes);
    ASSERT_EQ(cudaSuccess, cudaGraphLaunch(exec, cu(producer)));
    sync(producer);
    ASSERT_TRUE(host.all(7)) << "launch " << launch;
  }
  EXPECT_EQ("", take_simcuda_violations());
  EXPECT_EQ(cudaSuccess, cudaGraphExecDestroy(exec));
  EXPECT_EQ(cudaSuccess, cudaGraphDestroy(graph));
}

TEST_P(GraphCapture, AFreeOnAnotherCapturedStreamFollowsTheCurrentStreamsCapturedWork) {
  arcpool_stream_t producer = make_stream(), consumer = make_stream();
  begin(producer);
  arcpool_allocation_t* a = allocate(kBytes, producer);
  edge(producer, consumer);  // fork before the fill: only arcpool orders the free after it
  fill_async(producer, data(a), kBytes, 1);
  ASSERT_OK(arcpool_deallocate_async(a, consumer, 0));
  arcpool_allocation_release(a);
  edge(consumer, producer);
  cudaGraph_t graph = end(producer);
  ASSERT_NE(nullptr, graph);
  cudaGraphExec_t exec = instantiate(graph);
  for (int launch = 0; launch < 10; ++launch)
    ASSERT_EQ(cudaSuccess, cudaGraphLaunch(exec, cu(producer)));
  sync(producer);
  EXPECT_EQ("", take_simcuda_violations()) << "the free node must follow the fill";
  EXPECT_EQ(cudaSuccess, cudaGraphExecDestroy(exec));
  EXPECT_EQ(cudaSuccess, cudaGraphDestroy(graph));
}

// A graph's free node that fails after the deallocation's commit (a broken context) is counted in
// reclaim_failures, as a free's failure after its commit is outside captures; it was counted
// nowhere.
TEST_P(GraphCapture, AFreeNodeThatFailsAfterTheCommitIsCountedAsAReclaimFailure) {
  if (!on_simcuda()) GTEST_SKIP() << "fails the free node with simcuda_fail_next";
  arcpool_stream_t s = make_stream();
  begin(s);
  arcpool_allocation_t* a = allocate(kBytes, s);
  ASSERT_TRUE(is_graph_memory(a));
  ASSERT_TRUE(simcuda_fail_next("cudaFreeAsync", cudaErrorInvalidValue));
  EXPECT_STATUS(ARCPOOL_STATUS_CUDA_ERROR, arcpool_deallocate_async(a, s, 0));
  arcpool_allocation_release(a);
  const arcpool_stats_t st = stats();
  EXPECT_EQ(0u, st.graph_frees);
  EXPECT_EQ(1u, st.reclaim_failures);
  cudaGraph_t graph = nullptr;
  cudaStreamEndCapture(cu(s), &graph);  // the capture may have been invalidated
  if (graph != nullptr) cudaGraphDestroy(graph);
  cudaGetLastError();
  take_simcuda_violations();  // the graph's allocation is left unfreed on purpose
}

TEST_P(GraphCapture, GraphMemoryTheGraphDoesNotFreeIsFreedOutsideAfterALaunch) {
  arcpool_stream_t s = make_stream();
  begin(s);
  arcpool_allocation_t* a = allocate(kBytes, s);
  void* const p = data(a);
  fill_async(s, p, kBytes, 3);
  cudaGraph_t graph = end(s);
  ASSERT_NE(nullptr, graph);
  cudaGraphExec_t exec = instantiate(graph);
  ASSERT_EQ(cudaSuccess, cudaGraphLaunch(exec, cu(s)));
  // cudaGraphLaunch: a relaunch with the last launch's allocation unfreed fails.
  EXPECT_EQ(cudaErrorInvalidValue, cudaGraphLaunch(exec, cu(s)));
  cudaGetLastError();
  void* raw = nullptr;  // its graph frees it: never handed out raw
  EXPECT_STATUS(ARCPOOL_STATUS_UNSUPPORTED, arcpool_allocation_export(a, &raw));
  EXPECT_NE(nullptr, std::strstr(arcpool_last_error(), "graph memory")) << arcpool_last_error();
  const arcpool_stats_t before = stats();
  ASSERT_OK(arcpool_deallocate_async(a, s, 0));
  arcpool_allocation_release(a);
  const arcpool_stats_t after = stats();
  EXPECT_EQ(before.cache_frees, after.cache_frees) << "graph memory is never cached";
  EXPECT_EQ(0u, after.graph_bytes_in_use_current);
  ASSERT_EQ(cudaSuccess, cudaGraphLaunch(exec, cu(s))) << "freed outside: relaunch allowed";
  // That launch's allocation has no arcpool record: free it the way CUDA says.
  ASSERT_EQ(cudaSuccess, cudaFreeAsync(p, cu(s)));
  sync(s);
  EXPECT_EQ(cudaSuccess, cudaGraphExecDestroy(exec));
  EXPECT_EQ(cudaSuccess, cudaGraphDestroy(graph));
}

TEST_P(GraphCapture, EarlierMemoryFreedDuringCaptureIsReclaimedOnlyAfterTheGraphIsGone) {
  arcpool_stream_t s = make_stream(), other = make_stream();
  arcpool_allocation_t* a = allocate(kBytes, s);
  void* const block = data(a);
  begin(s);
  fill_async(s, block, kBytes, 5);
  ASSERT_OK(arcpool_deallocate_async(a, s, 0));
  arcpool_allocation_release(a);
  EXPECT_EQ(1u, stats().graph_deferred_frees);
  cudaGraph_t graph = end(s);
  ASSERT_NE(nullptr, graph);
  cudaGraphExec_t exec = instantiate(graph);
  ASSERT_EQ(cudaSuccess, cudaGraphLaunch(exec, cu(s)));
  sync(s);
  // The graph may use the block at every launch while it lives: it is lent to no one.
  arcpool_allocation_t* b = allocate(kBytes, other);
  EXPECT_NE(block, data(b));
  ASSERT_OK(arcpool_deallocate_async(b, other, 0));
  arcpool_allocation_release(b);
  sync(other);
  EXPECT_EQ(0u, core().reclaim_pending()) << "the free waits for the graph, not the reclaimer";
  EXPECT_EQ(kBytes, stats().bytes_held_current - stats().bytes_cached_current);
  ASSERT_EQ(cudaSuccess, cudaGraphLaunch(exec, cu(s)));
  EXPECT_EQ(cudaSuccess, cudaGraphExecDestroy(exec));
  EXPECT_EQ(cudaSuccess, cudaGraphDestroy(graph));
  // The user object's destructor hands the free to the reclaim worker, which fences the
  // stream once more and frees on it.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (stats().bytes_held_current - stats().bytes_cached_current != 0 &&
         std::chrono::steady_clock::now() < until) {
    sync(s);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(0u, stats().bytes_held_current - stats().bytes_cached_current);
  // Never on the origin: a stream that captured may capture again, and a free enqueued on it
  // then would land in that capture.
  const std::vector<arcpool_stream_t> freed_on = streams_that_freed(block);
  ASSERT_EQ(1u, freed_on.size());
  EXPECT_NE(s, freed_on.front());
  EXPECT_EQ("", take_simcuda_violations());
}

// A use on another thread's per-thread default stream took its fence when it was recorded, for
// this thread cannot name that stream: a free during capture waits for that fence, as a free
// outside capture does (design.md §6). It was dropped, and the block freed under the use.
TEST_P(GraphCapture, AFreeDuringCaptureWaitsForAUseOnAnotherThreadsPerThreadStream) {
  const auto per_thread = reinterpret_cast<arcpool_stream_t>(0x2);
  arcpool_stream_t s = make_stream();
  arcpool_allocation_t* a = allocate(kBytes, s);
  sync(s);
  gate* held = nullptr;
  std::promise<void> used, go_on;
  std::thread user([&] {
    held = &block(per_thread);
    fill_async(per_thread, data(a), kBytes, 7);
    EXPECT_OK(arcpool_record_use(a, per_thread));
    used.set_value();
    go_on.get_future().wait();
    sync(per_thread);
  });
  used.get_future().wait();
  begin(s);
  EXPECT_OK(arcpool_deallocate_async(a, s, 0));
  arcpool_allocation_release(a);
  EXPECT_EQ(cudaSuccess, cudaGraphDestroy(end(s)));
  await_posted_tasks();
  run_unheld({s});
  expect_pending(1, kBytes, 0);  // the graph is gone and s fenced: the use holds the free
  held->open();
  go_on.set_value();
  user.join();
  finish_and_expect_nothing_held();
}

// A per-thread default stream is no stream arcpool created or registered: arcpool refuses it
// while it captures (docs/graphs.md), also once this thread's stream cache knows it from an
// allocation made before the capture. An allocation accepted there took no fence (§6), and a
// free from another thread after the graph's launch waited for nothing.
TEST_P(GraphCapture, APerThreadStreamThisThreadUsedBeforeItsCaptureIsRefusedInIt) {
  const auto per_thread = reinterpret_cast<arcpool_stream_t>(0x2);
  std::thread([&] {
    ASSERT_EQ(cudaSuccess, cudaSetDevice(0));
    arcpool_allocation_t* before = allocate(kBytes, per_thread);  // caches the stream's line
    ASSERT_NE(nullptr, before);
    begin(per_thread);
    arcpool_allocation_t* a = nullptr;
    EXPECT_STATUS(ARCPOOL_STATUS_UNSUPPORTED,
                  arcpool_allocate_async(alloc_, kBytes, 0, per_thread, 0, &a));
    EXPECT_STATUS(ARCPOOL_STATUS_UNSUPPORTED, arcpool_deallocate_async(before, per_thread, 0));
    cudaGraph_t graph = end(per_thread);
    if (graph != nullptr) {
      EXPECT_EQ(cudaSuccess, cudaGraphDestroy(graph));
    }
    if (a != nullptr) arcpool_allocation_release(a);
    EXPECT_OK(arcpool_deallocate_async(before, per_thread, 0));
    arcpool_allocation_release(before);
    sync(per_thread);
  }).join();
  await_posted_tasks();
  finish_and_expect_nothing_held();
}

// A use recorded of a stream arcpool does not know was fenced then: the stream may be gone by
// the deallocation (arcpool_record_use), and a free in a capture, as one outside, uses that
// fence and asks the stream nothing (it asked whether the destroyed stream captured).
TEST_P(GraphCapture, AFreeDuringCaptureAsksNothingOfAUseStreamDestroyedSinceItsRecord) {
  arcpool_stream_t s = make_stream();
  arcpool_stream_t user = make_app_stream();
  arcpool_allocation_t* a = allocate(kBytes, s);
  sync(s);
  fill_async(user, data(a), kBytes, 7);
  EXPECT_OK(arcpool_record_use(a, user));  // fenced now: arcpool does not know the stream
  sync(user);
  destroy_app_stream(user);
  begin(s);
  EXPECT_OK(arcpool_deallocate_async(a, s, 0));
  arcpool_allocation_release(a);
  EXPECT_EQ(cudaSuccess, cudaGraphDestroy(end(s)));
  await_posted_tasks();
  finish_and_expect_nothing_held();
}

// A free deferred to a graph's end fences its stream once the graph is gone, and that stream
// may capture again first (a loop that captures every step). A drain then (an out-of-memory
// retry, a trim) cannot fence it: the free stays queued until that capture ended. It was given
// up, the block lost to the pool for good and counted as a reclaim failure.
TEST_P(GraphCapture, ADrainWhileTheDeferredFreesStreamCapturesAgainKeepsTheFreeQueued) {
  arcpool_stream_t s = make_stream();
  arcpool_allocation_t* a = allocate(kBytes, s);
  begin(s);
  fill_async(s, data(a), kBytes, 5);
  ASSERT_OK(arcpool_deallocate_async(a, s, 0));
  arcpool_allocation_release(a);
  cudaGraph_t first = end(s);
  begin(s);  // the next step's capture, before the first graph goes
  EXPECT_EQ(cudaSuccess, cudaGraphDestroy(first));
  await_posted_tasks();
  // From another thread: this one's capture (thread-local mode) would refuse trim's syncs.
  std::thread([&] { EXPECT_OK(arcpool_allocator_trim(alloc_, 0)); }).join();
  EXPECT_EQ(0u, stats().reclaim_failures);
  EXPECT_EQ(1u, core().reclaim_pending()) << "the free waits for the capture's end";
  EXPECT_EQ(cudaSuccess, cudaGraphDestroy(end(s)));
  sync(s);
  finish_reclaims();
  EXPECT_EQ(0u, stats().reclaim_failures);
  EXPECT_EQ(0u, stats().bytes_held_current - stats().bytes_cached_current);
}

// Memory whose current stream captures another graph may be used by each launch of that graph,
// which a free deferred to this graph's end would not wait for: refused, nothing changed, as a
// transfer across captures is. It was deferred, and then freed under the other graph.
TEST_P(GraphCapture, AFreeOfMemoryAnotherCaptureUsesIsRefused) {
  arcpool_stream_t s = make_stream(), theirs = make_stream();
  arcpool_allocation_t* a = allocate(kBytes, theirs);
  begin(theirs);
  fill_async(theirs, data(a), kBytes, 6);
  begin(s);
  EXPECT_STATUS(ARCPOOL_STATUS_UNSUPPORTED, arcpool_deallocate_async(a, s, 0));
  EXPECT_NE(nullptr, std::strstr(arcpool_last_error(), "captures another graph"))
      << arcpool_last_error();
  EXPECT_EQ(0u, stats().graph_deferred_frees);
  EXPECT_EQ(cudaSuccess, cudaGraphDestroy(end(s)));
  EXPECT_EQ(cudaSuccess, cudaGraphDestroy(end(theirs)));
  ASSERT_OK(arcpool_deallocate_async(a, theirs, 0));  // still its owner's to free
  arcpool_allocation_release(a);
  sync(theirs);
  finish_and_expect_nothing_held();
}

// Captured edges order a graph's nodes only: a transfer's donor may still have work queued from
// before the capture, ordered before nothing the receiver does. Memory from before the capture
// keeps the donor as a use record, so that its free waits for that work. It was dropped: the
// free, deferred to the graph's end, fenced only the receiver and ran under the donor's work.
TEST_P(GraphCapture, ATransferDuringCaptureKeepsTheDonorsEarlierWorkBeforeTheFree) {
  arcpool_stream_t s = make_stream(), consumer = make_stream();
  arcpool_allocation_t* a = allocate(kBytes, s);
  gate& held = block(s);
  fill_async(s, data(a), kBytes, 4);  // queued before the capture, held
  begin(s);
  edge(s, consumer);
  ASSERT_OK(arcpool_transfer(a, consumer));
  ASSERT_OK(arcpool_transfer(a, consumer));  // again, to the stream it is on: nothing dropped
  ASSERT_OK(arcpool_deallocate_async(a, consumer, 0));
  arcpool_allocation_release(a);
  edge(consumer, s);  // join
  EXPECT_EQ(cudaSuccess, cudaGraphDestroy(end(s)));
  await_posted_tasks();
  run_unheld({consumer});
  expect_pending(1, kBytes, 0);  // the graph is gone: the donor's held work holds the free
  held.open();
  sync(s);
  finish_and_expect_nothing_held();
}

// A use recorded on a stream arcpool does not know, without the flag that it outlives the
// deallocation, was fenced then: the stream may be gone (arcpool_record_use), so a transfer
// during a capture asks it nothing and is refused, nothing changed. It asked the destroyed
// stream whether it captured.
TEST_P(GraphCapture, ATransferDuringCaptureAsksNoStreamAUseWasFencedOnWhenRecorded) {
  arcpool_stream_t s = make_stream(), consumer = make_stream(), gone = make_app_stream();
  arcpool_allocation_t* a = allocate(kBytes, s);
  ASSERT_OK(arcpool_record_use(a, gone));
  sync(gone);
  destroy_app_stream(gone);
  begin(s);
  edge(s, consumer);
  EXPECT_STATUS(ARCPOOL_STATUS_UNSUPPORTED, arcpool_transfer(a, consumer));
  EXPECT_NE(nullptr, std::strstr(arcpool_last_error(), "it may be gone")) << arcpool_last_error();
  EXPECT_EQ(s, info(a).current_stream);
  edge(consumer, s);  // join
  EXPECT_EQ(cudaSuccess, cudaGraphDestroy(end(s)));
  ASSERT_OK(arcpool_deallocate_async(a, s, 0));
  arcpool_allocation_release(a);
  sync(s);
  finish_and_expect_nothing_held();
}

// The donor stays a use record only when arcpool can fence it once the capture is over: a
// stream it neither created nor registered may be gone by then. Refused, nothing changed.
TEST_P(GraphCapture, ATransferDuringCaptureFromAStreamArcpoolCannotFenceLaterIsRefused) {
  arcpool_stream_t app = make_app_stream(), consumer = make_stream();
  arcpool_allocation_t* a = allocate(kBytes, app);
  begin(app);
  edge(app, consumer);
  EXPECT_STATUS(ARCPOOL_STATUS_UNSUPPORTED, arcpool_transfer(a, consumer));
  EXPECT_NE(nullptr, std::strstr(arcpool_last_error(), "could not fence")) << arcpool_last_error();
  EXPECT_EQ(app, info(a).current_stream);
  edge(consumer, app);  // join
  EXPECT_EQ(cudaSuccess, cudaGraphDestroy(end(app)));
  ASSERT_OK(arcpool_deallocate_async(a, app, 0));
  arcpool_allocation_release(a);
  sync(app);
  finish_and_expect_nothing_held();
}

TEST_P(GraphCapture, AUserObjectsDestructorNeverWaitsForTheReclaimWorker) {
  // cudaUserObjectCreate: "Destructor callbacks cannot make CUDA API calls and should avoid
  // blocking behavior, as they are executed by a shared internal thread."
  if (!on_simcuda()) GTEST_SKIP() << "needs simcuda's pause points (simcuda_delay_calls)";
  arcpool_stream_t s = make_stream(), other = make_stream();
  arcpool_allocation_t* a = allocate(kBytes, s);
  begin(s);
  fill_async(s, data(a), kBytes, 5);
  ASSERT_OK(arcpool_deallocate_async(a, s, 0));
  arcpool_allocation_release(a);
  cudaGraph_t graph = end(s);
  ASSERT_NE(nullptr, graph);
  // The reclaim worker polls a deferred free's fence in queries of 3 s each, its lock held: a
  // destructor that waited for it would block about 2.8 s, well past the bound below, which a
  // loaded machine's scheduling (a lock-free post takes microseconds) stays far under.
  ASSERT_TRUE(simcuda_delay_calls("cudaEventQuery", 3000));
  arcpool_allocation_t* b = allocate(kBytes, s);
  ASSERT_OK(arcpool_record_use(b, other));
  ASSERT_OK(arcpool_deallocate_async(b, other, ARCPOOL_DEALLOCATE_FLAG_DEFERRED));
  arcpool_allocation_release(b);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the worker is querying
  const uint64_t before = simcuda_destructors_run(nullptr);
  EXPECT_EQ(cudaSuccess, cudaGraphDestroy(graph));
  uint64_t longest_us = 0;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (simcuda_destructors_run(&longest_us) == before &&
         std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  simcuda_delay_calls("cudaEventQuery", 0);
  EXPECT_LT(longest_us, 1'000'000u) << "the graph's user-object destructor blocked for "
                                    << longest_us << " us, waiting for the reclaim worker";
  // The worker still gives the deferred frees back.
  sync(s);
  sync(other);
  finish_and_expect_nothing_held();
}

TEST_P(GraphCapture, APreserveWhileADeallocationArmsTheGraphsFreeKeepsTheAllocationLive) {
  // A preserve takes no lock: another reference's holder may add an owner after the
  // deallocation checked that its caller owns the allocation alone, while it arms the free
  // that the graph's end runs. The deallocation is then refused, and the armed free must free
  // nothing: the allocation lives on with two owners, whose later deallocation frees it once.
  if (!on_simcuda()) GTEST_SKIP() << "needs simcuda's pause points (simcuda_delay_calls)";
  arcpool_stream_t s = make_stream();
  arcpool_allocation_t* a = allocate(kBytes, s);
  begin(s);
  fill_async(s, data(a), kBytes, 5);
  ASSERT_TRUE(simcuda_delay_calls("cudaGraphRetainUserObject", 400));
  std::thread preserver([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // inside the graph call now
    EXPECT_OK(arcpool_allocation_preserve(a));
  });
  const arcpool_status_t status = arcpool_deallocate_async(a, s, 0);
  preserver.join();
  simcuda_delay_calls("cudaGraphRetainUserObject", 0);
  EXPECT_EQ(ARCPOOL_STATUS_NOT_OWNER, status) << "two owners by the commit";
  EXPECT_EQ(ARCPOOL_ALLOCATION_LIVE, info(a).state);
  EXPECT_EQ(2u, info(a).owners);
  EXPECT_EQ(0u, stats().graph_deferred_frees);
  EXPECT_EQ(cudaSuccess, cudaGraphDestroy(end(s)));
  await_posted_tasks();
  finish_reclaims();
  EXPECT_EQ(0u, stats().frees + stats().deferred_frees) << "the refused deallocation freed";
  EXPECT_EQ(uint64_t{kBytes}, stats().bytes_in_use_current);
  int was_last = -1;
  ASSERT_OK(arcpool_allocation_discard(a, &was_last));
  EXPECT_EQ(0, was_last);
  ASSERT_OK(arcpool_deallocate_async(a, s, 0));
  arcpool_allocation_release(a);
  sync(s);
  finish_and_expect_nothing_held();
}

TEST_P(GraphCapture, TwoThreadsFreeingIntoOneCaptureNeverCallOnItsGraphAtOnce) {
  // Driver API, "Graph object thread safety": "API calls accessing the same graph object must
  // be serialized externally". simcuda reports a call on a graph that another thread's call is
  // paused inside.
  if (!on_simcuda()) GTEST_SKIP() << "needs simcuda's pause points (simcuda_delay_calls)";
  arcpool_stream_t s = make_stream(), joined = make_stream();
  arcpool_allocation_t* a = allocate(kBytes, s);
  arcpool_allocation_t* b = allocate(kBytes, joined);
  begin(s);
  edge(s, joined);  // both streams capture into one graph
  ASSERT_TRUE(simcuda_delay_calls("cudaGraphRetainUserObject", 300));
  std::thread second([&] { EXPECT_OK(arcpool_deallocate_async(b, joined, 0)); });
  EXPECT_OK(arcpool_deallocate_async(a, s, 0));
  second.join();
  simcuda_delay_calls("cudaGraphRetainUserObject", 0);
  EXPECT_EQ(2u, stats().graph_deferred_frees);
  arcpool_allocation_release(a);
  arcpool_allocation_release(b);
  edge(joined, s);
  cudaGraph_t graph = end(s);
  ASSERT_NE(nullptr, graph);
  EXPECT_EQ("", take_simcuda_violations()) << "two calls on the capture's graph overlapped";
  EXPECT_EQ(cudaSuccess, cudaGraphDestroy(graph));
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (stats().bytes_held_current - stats().bytes_cached_current != 0 &&
         std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(0u, stats().bytes_held_current - stats().bytes_cached_current);
}

TEST_P(GraphCapture, TheStreamCacheIsNeitherHitNorFilledDuringCapture) {
  arcpool_stream_t s = make_stream();
  arcpool_allocation_t* cached = allocate(kBytes, s);
  void* const block = data(cached);
  ASSERT_OK(arcpool_deallocate_async(cached, s, 0));
  arcpool_allocation_release(cached);
  arcpool_allocation_t* earlier = allocate(2 * kBytes, s);  // freed during the capture below
  const arcpool_stats_t before = stats();
  ASSERT_EQ(kBytes, before.bytes_cached_current);
  begin(s);
  arcpool_allocation_t* a = allocate(kBytes, s);
  EXPECT_NE(block, data(a)) << "a cache hit would put pool memory in the graph";
  EXPECT_EQ(before.cache_hits, stats().cache_hits);
  ASSERT_OK(arcpool_deallocate_async(a, s, 0));
  arcpool_allocation_release(a);
  EXPECT_EQ(before.cache_frees, stats().cache_frees) << "graph memory is never cached";
  // Pool memory freed on its own stream during the capture: its free waits for the graph's
  // end (docs/graphs.md), never the cache, whose next allocation after the capture would
  // otherwise reuse it while the graph may still use it.
  ASSERT_OK(arcpool_deallocate_async(earlier, s, 0));
  arcpool_allocation_release(earlier);
  EXPECT_EQ(before.cache_frees, stats().cache_frees) << "a free during capture was cached";
  EXPECT_EQ(kBytes, stats().bytes_cached_current);
  cudaGraph_t graph = end(s);
  ASSERT_NE(nullptr, graph);
  EXPECT_EQ(cudaSuccess, cudaGraphDestroy(graph));
  arcpool_allocation_t* again = allocate(kBytes, s);
  EXPECT_EQ(block, data(again)) << "the cached block is still there after the capture";
  ASSERT_OK(arcpool_deallocate_async(again, s, 0));
  arcpool_allocation_release(again);
}

TEST_P(GraphCapture, TransfersAndUseRecordsWithinACaptureBecomeCapturedEdges) {
  arcpool_stream_t s = make_stream(), consumer = make_stream(), reader = make_stream();
  host_bytes moved, read;
  begin(s);
  edge(s, consumer);  // both join the capture before the fills: only arcpool orders them after
  edge(s, reader);
  arcpool_allocation_t* a = allocate(kBytes, s);
  fill_async(s, data(a), kBytes, 3);
  ASSERT_OK(arcpool_transfer(a, consumer));  // an edge from s: the consumer reads the fill
  EXPECT_EQ(consumer, info(a).current_stream);
  ASSERT_EQ(cudaSuccess,
            cudaMemcpyAsync(moved.p, data(a), kBytes, cudaMemcpyDefault, cu(consumer)));
  ASSERT_OK(arcpool_deallocate_async(a, consumer, 0));
  arcpool_allocation_release(a);
  arcpool_allocation_t* b = allocate(kBytes, s);
  fill_async(s, data(b), kBytes, 5);
  edge(s, reader);  // the application orders its read after the fill
  ASSERT_EQ(cudaSuccess, cudaMemcpyAsync(read.p, data(b), kBytes, cudaMemcpyDefault, cu(reader)));
  ASSERT_OK(arcpool_record_use(b, reader));
  ASSERT_OK(arcpool_deallocate_async(b, s, 0));  // an edge from the reader: the free follows
  arcpool_allocation_release(b);
  edge(consumer, s);  // join
  cudaGraph_t graph = end(s);
  ASSERT_NE(nullptr, graph);
  cudaGraphExec_t exec = instantiate(graph);
  for (int launch = 0; launch < 10; ++launch) {
    std::memset(moved.p, 0, kBytes);
    std::memset(read.p, 0, kBytes);
    ASSERT_EQ(cudaSuccess, cudaGraphLaunch(exec, cu(s)));
    sync(s);
    ASSERT_TRUE(moved.all(3)) << "launch " << launch;
    ASSERT_TRUE(read.all(5)) << "launch " << launch;
  }
  EXPECT_EQ("", take_simcuda_violations());
  EXPECT_EQ(cudaSuccess, cudaGraphExecDestroy(exec));
  EXPECT_EQ(cudaSuccess, cudaGraphDestroy(graph));
}

TEST_P(GraphCapture, TransfersAndUseRecordsAcrossTheCaptureBoundaryAreRefused) {
  arcpool_stream_t s = make_stream(), capturing = make_stream();
  arcpool_allocation_t* a = allocate(kBytes, s);
  begin(capturing);
  EXPECT_STATUS(ARCPOOL_STATUS_UNSUPPORTED, arcpool_transfer(a, capturing));
  EXPECT_STATUS(ARCPOOL_STATUS_UNSUPPORTED, arcpool_record_use(a, capturing));
  arcpool_allocation_t* g = allocate(kBytes, capturing);
  // Graph memory is not usable outside its graph before a launch.
  EXPECT_STATUS(ARCPOOL_STATUS_UNSUPPORTED, arcpool_transfer(g, s));
  EXPECT_STATUS(ARCPOOL_STATUS_UNSUPPORTED, arcpool_deallocate_async(g, s, 0));
  EXPECT_EQ(capturing, info(g).current_stream);
  ASSERT_OK(arcpool_deallocate_async(g, capturing, 0));
  arcpool_allocation_release(g);
  cudaGraph_t graph = end(capturing);
  ASSERT_NE(nullptr, graph);
  EXPECT_EQ(cudaSuccess, cudaGraphDestroy(graph));
  EXPECT_EQ(ARCPOOL_ALLOCATION_LIVE, info(a).state);
  ASSERT_OK(arcpool_deallocate_async(a, s, 0));
  arcpool_allocation_release(a);
}

TEST_P(GraphCapture, AGlobalCaptureOnAnotherThreadIsNotBrokenByArcpoolsCalls) {
  arcpool_stream_t s = make_stream(), captured = make_stream(), other = make_stream();
  global_capture capture(captured, [&] {
    arcpool_allocation_t* g = allocate(kBytes, captured);
    EXPECT_OK(arcpool_deallocate_async(g, captured, 0));
    arcpool_allocation_release(g);
  });
  // Allocations, same-stream and routed frees, fences and the reclaim worker's queries, while
  // the other thread's global capture is open.
  for (int i = 0; i < 20; ++i) {
    arcpool_allocation_t* a = allocate(kBytes, s);
    fill_async(s, data(a), kBytes, i);
    ASSERT_OK(arcpool_record_use(a, other));
    ASSERT_OK(arcpool_deallocate_async(a, other, ARCPOOL_DEALLOCATE_FLAG_DEFERRED));
    arcpool_allocation_release(a);
  }
  EXPECT_EQ(cudaSuccess, capture.end()) << "the capture was invalidated by an arcpool call";
  sync(s);
  sync(other);
  finish_reclaims();
}

TEST_P(GraphCapture, PoolCallsRunRelaxedUnderAGlobalCaptureOnAnotherThread) {
  // Reading the statistics (pool attributes), resetting the peaks, and creating and destroying
  // an allocator with its owned pool, while another thread's global capture is open. NVIDIA's
  // CCCL refuses pool calls to a capturing thread unless relaxed; simcuda warns (an unverified
  // rule) for each one made unrelaxed, and on a GPU the capture would be invalidated.
  global_capture capture(make_stream());
  const uint64_t warnings = simcuda_unverified_warnings();
  stats();  // the pool's figures
  EXPECT_OK(arcpool_stats_reset_peaks(alloc_));
  {
    arcpool::allocator_options options;  // an owned pool, the default
    options.driver = ARCPOOL_DRIVER_CUDA;
    arcpool::allocator other(options);
  }
  EXPECT_EQ(warnings, simcuda_unverified_warnings()) << "a pool call made unrelaxed";
  EXPECT_EQ(cudaSuccess, capture.end()) << "the capture was invalidated by an arcpool call";
}

// design.md §9: under the synchronize policy a free synchronizes the device, as cudaFree does,
// which the programming guide calls invalid while any stream of the device captures. The free
// fails and keeps its memory, and the capture is invalidated, as with cudaFree.
TEST_P(GraphCapture, AnAmbientSynchronizingFreeDuringACaptureFailsAndKeepsItsMemory) {
  ASSERT_OK(arcpool_allocator_set_ambient_stream(alloc_, ARCPOOL_AMBIENT_SYNCHRONIZE, nullptr));
  void* p = nullptr;
  ASSERT_OK(arcpool_ambient_malloc(alloc_, kBytes, &p));
  global_capture capture(make_stream());
  EXPECT_NE(ARCPOOL_STATUS_SUCCESS, arcpool_ambient_free(alloc_, p));
  EXPECT_EQ(cudaErrorStreamCaptureInvalidated, capture.end());
  EXPECT_EQ(kBytes, stats().bytes_in_use_current) << "the failed free kept its memory";
  ASSERT_OK(arcpool_ambient_free(alloc_, p));
  EXPECT_EQ(0u, stats().bytes_in_use_current);
  finish_reclaims();
}

// Under the synchronize policy a free of NULL does nothing, as cudaFree's, and a free of a
// pointer arcpool did not hand out is refused: neither synchronizes the device, which blocked
// and invalidated another thread's capture for nothing.
TEST_P(GraphCapture, AnAmbientFreeOfNullOrAnUnknownPointerLeavesACaptureIntact) {
  ASSERT_OK(arcpool_allocator_set_ambient_stream(alloc_, ARCPOOL_AMBIENT_SYNCHRONIZE, nullptr));
  global_capture capture(make_stream());
  EXPECT_OK(arcpool_ambient_free(alloc_, nullptr));
  int not_arcpools = 0;
  EXPECT_STATUS(ARCPOOL_STATUS_UNKNOWN_POINTER, arcpool_ambient_free(alloc_, &not_arcpools));
  EXPECT_EQ(cudaSuccess, capture.end()) << "a free with nothing to free synchronized the device";
}

// design.md §9: under the synchronize policy an allocation synchronizes its stream before it
// returns. When that synchronization fails, the caller takes the failure for "nothing
// allocated", so the memory goes back: before, it stayed allocated, its pointer nowhere but in
// arcpool's map.
TEST_P(GraphCapture, AnAmbientSynchronizingMallocWhoseSynchronizationFailsKeepsNothing) {
  if (!on_simcuda()) GTEST_SKIP() << "injects the failure with simcuda_fail_next";
  ASSERT_OK(arcpool_allocator_set_ambient_stream(alloc_, ARCPOOL_AMBIENT_SYNCHRONIZE, nullptr));
  void* p = reinterpret_cast<void*>(1);
  ASSERT_TRUE(simcuda_fail_next("cudaStreamSynchronize", cudaErrorUnknown));
  EXPECT_STATUS(ARCPOOL_STATUS_CUDA_ERROR, arcpool_ambient_malloc(alloc_, kBytes, &p));
  EXPECT_NE(nullptr, std::strstr(arcpool_last_error(), "cudaStreamSynchronize"))
      << arcpool_last_error();
  EXPECT_EQ(nullptr, p);
  EXPECT_EQ(0u, stats().bytes_in_use_current) << "the failed allocation kept its memory";
  EXPECT_EQ(0u, stats().allocations_in_use_current);
  ASSERT_OK(arcpool_ambient_malloc(alloc_, kBytes, &p));  // the next one succeeds
  ASSERT_OK(arcpool_ambient_free(alloc_, p));
  finish_reclaims();
}

TEST_P(GraphCapture, TheByPointerPathAllocatesAndFreesGraphMemoryInTheCapture) {
  arcpool_stream_t s = make_stream();
  host_bytes host;
  const arcpool_stats_t before = stats();
  begin(s);
  void* p = nullptr;
  ASSERT_OK(arcpool_allocator_malloc_async(alloc_, kBytes, 0, s, &p));
  fill_async(s, p, kBytes, 9);
  ASSERT_EQ(cudaSuccess, cudaMemcpyAsync(host.p, p, kBytes, cudaMemcpyDefault, cu(s)));
  ASSERT_OK(arcpool_allocator_free_async(alloc_, p, s));
  EXPECT_STATUS(ARCPOOL_STATUS_UNKNOWN_POINTER, arcpool_allocator_free_async(alloc_, p, s))
      << "the record went with the free";
  cudaGraph_t graph = end(s);
  ASSERT_NE(nullptr, graph);
  EXPECT_EQ(before.graph_allocations + 1, stats().graph_allocations);
  EXPECT_EQ(before.graph_frees + 1, stats().graph_frees);
  cudaGraphExec_t exec = instantiate(graph);
  for (int launch = 0; launch < 3; ++launch) {
    std::memset(host.p, 0, kBytes);
    ASSERT_EQ(cudaSuccess, cudaGraphLaunch(exec, cu(s)));
    sync(s);
    EXPECT_TRUE(host.all(9)) << "launch " << launch;
  }
  EXPECT_EQ(cudaSuccess, cudaGraphExecDestroy(exec));
  EXPECT_EQ(cudaSuccess, cudaGraphDestroy(graph));
}

/// Graph pools: a pool bound to the capture of `s`.
class GraphPools : public GraphCapture {
 protected:
  void TearDown() override {
    arcpool_graph_pool_release(pool_);
    GraphCapture::TearDown();
  }
  void bind(arcpool_stream_t s) {
    if (pool_ == nullptr) {
      ASSERT_OK(arcpool_graph_pool_create(alloc_, &pool_));
    }
    ASSERT_OK(arcpool_graph_pool_begin(pool_, s));
  }
  bool is_pool_block(const arcpool_allocation_t* a) const {
    return (placement(a).flags & ARCPOOL_PLACEMENT_FLAG_GRAPH_POOL) != 0;
  }
  /// Waits (up to 10 s) until the graph pools hold nothing: the release ran.
  bool pools_released() {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (stats().graph_pool_bytes_current != 0 && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return stats().graph_pool_bytes_current == 0;
  }
  /// Captures on `s`, bound to the pool until the capture ends, a graph (`*graph`) whose output
  /// block outlives the capture, and returns that block.
  arcpool_allocation_t* capture_an_output(arcpool_stream_t s, cudaGraph_t* graph) {
    begin(s);
    bind(s);
    arcpool_allocation_t* out = allocate(kBytes, s);
    *graph = end(s);
    EXPECT_OK(arcpool_graph_pool_end(pool_, s));
    return out;
  }
  /// Releases the pool and expects everything back: its blocks returned to the allocator's
  /// pool and freed, nothing held but the stream caches.
  void release_pool_and_expect_all_back() {
    arcpool_graph_pool_release(std::exchange(pool_, nullptr));
    EXPECT_TRUE(pools_released());
    finish_and_expect_nothing_held();
  }
  arcpool_graph_pool_t* pool_ = nullptr;
};

TEST_P(GraphPools, APoolsBlockIsReusedInTheCaptureAndLentToNoOneElseWhileThePoolLives) {
  arcpool_stream_t s = make_stream(), other = make_stream();
  host_bytes host;
  begin(s);
  bind(s);
  arcpool_allocation_t* a = allocate(kBytes, s);
  ASSERT_TRUE(is_pool_block(a));
  EXPECT_FALSE(is_graph_memory(a)) << "pool memory reserved outside the capture";
  void* const block = data(a);
  fill_async(s, block, kBytes, 2);
  ASSERT_OK(arcpool_deallocate_async(a, s, 0));
  arcpool_allocation_release(a);
  arcpool_allocation_t* b = allocate(kBytes, s);
  EXPECT_EQ(block, data(b)) << "freed earlier on the same stream of the capture";
  fill_async(s, data(b), kBytes, 4);
  ASSERT_EQ(cudaSuccess, cudaMemcpyAsync(host.p, data(b), kBytes, cudaMemcpyDefault, cu(s)));
  ASSERT_OK(arcpool_deallocate_async(b, s, 0));
  arcpool_allocation_release(b);
  cudaGraph_t graph = end(s);
  ASSERT_NE(nullptr, graph);
  ASSERT_OK(arcpool_graph_pool_end(pool_, s));
  EXPECT_EQ(kBytes, stats().graph_pool_bytes_current);
  EXPECT_EQ(2u, stats().graph_frees);
  cudaGraphExec_t exec = instantiate(graph);
  for (int launch = 0; launch < 10; ++launch) {
    std::memset(host.p, 0, kBytes);
    ASSERT_EQ(cudaSuccess, cudaGraphLaunch(exec, cu(s)));
    sync(s);
    ASSERT_TRUE(host.all(4)) << "launch " << launch;
  }
  // Work outside the graph never gets the pool's block, even once the handle is released.
  arcpool_graph_pool_release(std::exchange(pool_, nullptr));
  for (int i = 0; i < 4; ++i) {
    arcpool_allocation_t* outside = allocate(kBytes, other);
    EXPECT_NE(block, data(outside));
    ASSERT_OK(arcpool_deallocate_async(outside, other, 0));
    arcpool_allocation_release(outside);
  }
  sync(other);
  EXPECT_EQ(kBytes, stats().graph_pool_bytes_current) << "the graph still uses it";
  EXPECT_EQ(cudaSuccess, cudaGraphExecDestroy(exec));
  EXPECT_EQ(cudaSuccess, cudaGraphDestroy(graph));
  EXPECT_TRUE(pools_released());
  finish_reclaims();
}

TEST_P(GraphPools, UnjoinedBranchesNeverShareAFreedBlock) {
  arcpool_stream_t s = make_stream(), branch = make_stream();
  begin(s);
  bind(s);
  edge(s, branch);  // fork
  arcpool_allocation_t* a = allocate(kBytes, s);
  fill_async(s, data(a), kBytes, 1);
  void* const block = data(a);
  ASSERT_OK(arcpool_deallocate_async(a, s, 0));
  arcpool_allocation_release(a);
  arcpool_allocation_t* b = allocate(kBytes, branch);
  EXPECT_TRUE(is_pool_block(b)) << "any stream of the bound capture allocates from the pool";
  EXPECT_NE(block, data(b)) << "the branch is not ordered after the free on the other stream";
  fill_async(branch, data(b), kBytes, 2);
  ASSERT_OK(arcpool_deallocate_async(b, branch, 0));
  arcpool_allocation_release(b);
  edge(branch, s);  // join
  cudaGraph_t graph = end(s);
  ASSERT_NE(nullptr, graph);
  ASSERT_OK(arcpool_graph_pool_end(pool_, s));
  cudaGraphExec_t exec = instantiate(graph);
  ASSERT_EQ(cudaSuccess, cudaGraphLaunch(exec, cu(s)));
  sync(s);
  EXPECT_EQ(cudaSuccess, cudaGraphExecDestroy(exec));
  EXPECT_EQ(cudaSuccess, cudaGraphDestroy(graph));
  arcpool_graph_pool_release(std::exchange(pool_, nullptr));
  EXPECT_TRUE(pools_released());
  finish_reclaims();
}

TEST_P(GraphPools, ABlockTheGraphKeepsGoesBackToThePoolWhenItsOwnerDeallocatesIt) {
  arcpool_stream_t s = make_stream();
  begin(s);
  bind(s);
  arcpool_allocation_t* out = allocate(kBytes, s);  // the graph's output, kept after capture
  fill_async(s, data(out), kBytes, 8);
  cudaGraph_t graph = end(s);
  ASSERT_NE(nullptr, graph);
  ASSERT_OK(arcpool_graph_pool_end(pool_, s));
  cudaGraphExec_t exec = instantiate(graph);
  for (int launch = 0; launch < 3; ++launch)
    ASSERT_EQ(cudaSuccess, cudaGraphLaunch(exec, cu(s))) << "pool memory: no relaunch rule";
  sync(s);
  expect_filled(data(out), kBytes, 8);
  EXPECT_EQ(kBytes, stats().graph_bytes_in_use_current);
  void* raw = nullptr;  // it goes back to its pool: never handed out raw
  EXPECT_STATUS(ARCPOOL_STATUS_UNSUPPORTED, arcpool_allocation_export(out, &raw));
  EXPECT_NE(nullptr, std::strstr(arcpool_last_error(), "graph pool's block"))
      << arcpool_last_error();
  ASSERT_OK(arcpool_deallocate_async(out, s, 0));
  arcpool_allocation_release(out);
  EXPECT_EQ(0u, stats().graph_bytes_in_use_current);
  EXPECT_EQ(kBytes, stats().graph_pool_bytes_current) << "still the pool's, not the allocator's";
  EXPECT_EQ(cudaSuccess, cudaGraphExecDestroy(exec));
  EXPECT_EQ(cudaSuccess, cudaGraphDestroy(graph));
  release_pool_and_expect_all_back();
}

// A block freed outside every capture comes back to its pool with fences of its streams' work.
// A capture bound to the pool is lent it only once that work completed: a launch of the graph
// is ordered after none of it. It was lent at once, and the graph could write it under a kernel.
TEST_P(GraphPools, ABlockFreedOutsideCaptureIsLentToACaptureOnlyOnceItsWorkCompleted) {
  arcpool_stream_t s = make_stream(), user = make_stream(), t = make_stream();
  cudaGraph_t first = nullptr;
  arcpool_allocation_t* out = capture_an_output(s, &first);
  void* const kept = data(out);
  gate& held = block(user);  // outside every capture, a held stream still uses the block
  ASSERT_OK(arcpool_record_use(out, user));
  fill_async(user, kept, kBytes, 3);
  ASSERT_OK(arcpool_deallocate_async(out, s, 0));
  arcpool_allocation_release(out);
  begin(t);
  bind(t);
  arcpool_allocation_t* b = allocate(kBytes, t);
  EXPECT_NE(kept, data(b)) << "lent to a capture while a stream outside it still used it";
  ASSERT_OK(arcpool_deallocate_async(b, t, 0));
  arcpool_allocation_release(b);
  cudaGraph_t second = end(t);
  ASSERT_OK(arcpool_graph_pool_end(pool_, t));
  held.open();
  sync(user);
  sync(s);   // its fence too
  begin(t);  // the work completed: the block is lent again
  bind(t);
  arcpool_allocation_t* c = allocate(kBytes, t);
  EXPECT_EQ(kept, data(c));
  ASSERT_OK(arcpool_deallocate_async(c, t, 0));
  arcpool_allocation_release(c);
  cudaGraph_t third = end(t);
  ASSERT_OK(arcpool_graph_pool_end(pool_, t));
  for (cudaGraph_t g : {first, second, third})
    EXPECT_EQ(cudaSuccess, cudaGraphDestroy(g));
  release_pool_and_expect_all_back();
}

// "end unbinds it, before or after the capture ended": also once the capture's graph is gone
// and the reclaim worker dropped what the binding lent. It answered INVALID_ARGUMENT then, or
// not, as the worker's timing had it.
TEST_P(GraphPools, EndAfterTheCapturesGraphIsGoneSucceedsOnce) {
  arcpool_stream_t s = make_stream();
  begin(s);
  bind(s);
  EXPECT_EQ(cudaSuccess, cudaGraphDestroy(end(s)));
  await_posted_tasks();
  EXPECT_OK(arcpool_graph_pool_end(pool_, s));
  EXPECT_STATUS(ARCPOOL_STATUS_INVALID_ARGUMENT, arcpool_graph_pool_end(pool_, s));
}

// Only a capture bound to the pool tells it when its graph is gone: a block freed in another
// capture is accepted all the same (frameworks' free hooks cannot take a refusal; PyTorch's
// graphs share one capture stream, so a block of one graph's pool is freed in the capture of
// the next), the pool told of that graph's end. Until then it is lent to no other capture, and
// it goes back once the graph is gone. (It was refused, UNSUPPORTED.)
TEST_P(GraphPools, ABlockFreedInACaptureNotBoundToItsPoolIsLentAgainOnlyOnceThatGraphIsGone) {
  arcpool_stream_t s = make_stream(), t = make_stream();
  cudaGraph_t first = nullptr;
  arcpool_allocation_t* out = capture_an_output(s, &first);
  EXPECT_EQ(cudaSuccess, cudaGraphDestroy(first));
  void* const block = data(out);
  begin(s);  // a capture bound to no pool
  ASSERT_OK(arcpool_deallocate_async(out, s, 0));
  arcpool_allocation_release(out);
  cudaGraph_t unbound = end(s);
  ASSERT_NE(nullptr, unbound);
  begin(t);
  bind(t);
  arcpool_allocation_t* b = allocate(kBytes, t);
  ASSERT_TRUE(is_pool_block(b));
  EXPECT_NE(block, data(b)) << "lent while the graph it was freed in lives";
  ASSERT_OK(arcpool_deallocate_async(b, t, 0));
  arcpool_allocation_release(b);
  EXPECT_EQ(cudaSuccess, cudaGraphDestroy(end(t)));
  ASSERT_OK(arcpool_graph_pool_end(pool_, t));
  EXPECT_EQ(cudaSuccess, cudaGraphDestroy(unbound));
  release_pool_and_expect_all_back();
}

// The binding may end before the capture does: the pool still hears of the capture's end, so
// its blocks may still be freed in it. (They were refused once end had run.)
TEST_P(GraphPools, ABlockFreedInItsCaptureAfterTheBindingEndedGoesBackToThePool) {
  arcpool_stream_t s = make_stream();
  begin(s);
  bind(s);
  arcpool_allocation_t* a = allocate(kBytes, s);
  ASSERT_OK(arcpool_graph_pool_end(pool_, s));
  EXPECT_OK(arcpool_deallocate_async(a, s, 0));
  arcpool_allocation_release(a);
  EXPECT_EQ(cudaSuccess, cudaGraphDestroy(end(s)));
  release_pool_and_expect_all_back();
}

// A dropped last reference cannot be refused: a block whose current stream captures a graph
// its pool does not hear of waits for the pool's release. It was refused, and the block kept
// its pool's reference for good: the pool, and the allocator it counts as a record of, leaked.
TEST_P(GraphPools, ABlockDroppedInACaptureNotBoundToItsPoolGoesBackOnceTheGraphIsGone) {
  arcpool_stream_t s = make_stream();
  cudaGraph_t first = nullptr;
  arcpool_allocation_t* out = capture_an_output(s, &first);
  begin(s);                         // a capture bound to no pool
  arcpool_allocation_release(out);  // its owner leaked: the last reference frees it
  EXPECT_EQ(0u, stats().reclaim_failures);
  EXPECT_EQ(cudaSuccess, cudaGraphDestroy(end(s)));
  EXPECT_EQ(cudaSuccess, cudaGraphDestroy(first));
  release_pool_and_expect_all_back();
}

// The pool is told of the end of the graph a block was dropped in, though that capture is bound
// to no pool: the graph may use the block at each launch, so that the block stays the pool's,
// and reserved, until the graph is gone, also past the pool's release by the application. (At
// that release it went back to the allocator's pool while the graph lived.)
TEST_P(GraphPools, ABlockDroppedInACaptureNotBoundToItsPoolStaysReservedWhileTheGraphLives) {
  arcpool_stream_t s = make_stream();
  cudaGraph_t first = nullptr;
  arcpool_allocation_t* out = capture_an_output(s, &first);
  EXPECT_EQ(cudaSuccess, cudaGraphDestroy(first));
  begin(s);  // a capture bound to no pool
  fill_async(s, data(out), kBytes, 5);
  arcpool_allocation_release(out);  // its owner leaked: the last reference frees it here
  EXPECT_EQ(0u, stats().reclaim_failures);
  cudaGraph_t graph = end(s);
  ASSERT_NE(nullptr, graph);
  arcpool_graph_pool_release(std::exchange(pool_, nullptr));
  EXPECT_EQ(kBytes, stats().graph_pool_bytes_current)
      << "the block left the pool while the graph that uses it lives";
  cudaGraphExec_t exec = instantiate(graph);
  ASSERT_EQ(cudaSuccess, cudaGraphLaunch(exec, cu(s)));
  sync(s);
  EXPECT_EQ(cudaSuccess, cudaGraphExecDestroy(exec));
  EXPECT_EQ(cudaSuccess, cudaGraphDestroy(graph));
  EXPECT_TRUE(pools_released()) << "the graph is gone, and the pool with it";
  finish_and_expect_nothing_held();
}

// A free in a capture not bound to the block's pool, refused because the block's current
// stream is outside that capture, changes nothing (docs/graphs.md): the pool was told of that
// graph's end first, and held on until that graph was gone, though no block was freed in it.
TEST_P(GraphPools, ARefusedFreeInACaptureNotBoundToItsPoolLeavesThePoolAsItWas) {
  arcpool_stream_t s = make_stream(), t = make_stream();
  cudaGraph_t first = nullptr;
  arcpool_allocation_t* out = capture_an_output(s, &first);
  EXPECT_EQ(cudaSuccess, cudaGraphDestroy(first));
  await_posted_tasks();
  begin(t);  // a capture bound to no pool; the block's current stream, s, is outside it
  EXPECT_STATUS(ARCPOOL_STATUS_UNSUPPORTED, arcpool_deallocate_async(out, t, 0));
  cudaGraph_t unrelated = end(t);
  EXPECT_OK(arcpool_deallocate_async(out, s, 0));
  arcpool_allocation_release(out);
  arcpool_graph_pool_release(std::exchange(pool_, nullptr));
  EXPECT_TRUE(pools_released()) << "a graph no block was freed in holds the pool";
  if (unrelated != nullptr) {
    EXPECT_EQ(cudaSuccess, cudaGraphDestroy(unrelated));
  }
  await_posted_tasks();
  EXPECT_TRUE(pools_released());
  finish_and_expect_nothing_held();
}

// A leaked block whose implicit free fails (a stream it is used on captures, so that arcpool
// cannot fence that stream) is written off, as other memory whose implicit free fails: its pool
// still goes at its release, and gives its other blocks back. (The block kept the pool's
// reference, and with it the pool and its allocator, for ever.)
TEST_P(GraphPools, ABlockWhoseImplicitFreeFailsIsWrittenOffAndItsPoolStillGoes) {
  arcpool_stream_t s = make_stream(), user = make_stream();
  begin(s);
  bind(s);
  arcpool_allocation_t* out = allocate(kBytes, s);  // the graph's output, kept after capture
  arcpool_allocation_t* spare = allocate(2 * kBytes, s);
  ASSERT_OK(arcpool_deallocate_async(spare, s, 0));
  arcpool_allocation_release(spare);
  EXPECT_EQ(cudaSuccess, cudaGraphDestroy(end(s)));
  ASSERT_OK(arcpool_graph_pool_end(pool_, s));
  ASSERT_OK(arcpool_record_use(out, user));
  begin(user);  // capturing: the free cannot fence it
  const uint64_t failures = stats().reclaim_failures;
  arcpool_allocation_release(out);  // its owner leaked: the last reference frees it, and fails
  EXPECT_EQ(failures + 1, stats().reclaim_failures);
  EXPECT_EQ(cudaSuccess, cudaGraphDestroy(end(user)));
  EXPECT_EQ(3 * kBytes, stats().graph_pool_bytes_current);
  arcpool_graph_pool_release(std::exchange(pool_, nullptr));
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (stats().graph_pool_bytes_current != kBytes && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(kBytes, stats().graph_pool_bytes_current)
      << "the pool kept its blocks: the written-off block held its reference";
  finish_reclaims();
  sync(s);
  EXPECT_OK(arcpool_allocator_trim(alloc_, 0));  // the pool's other blocks go back
  EXPECT_EQ(kBytes, stats().bytes_held_current) << "the reserved block left bytes_held";
  EXPECT_EQ(0u, stats().bytes_in_use_current) << "the written-off block stayed in use";
}

// A stream the bound capture forks to, which arcpool neither created nor registered (PyTorch's
// side streams in torch.cuda.graph): named by its handle for the capture, it allocates from the
// pool and gets its own freed block back, its blocks move by captured edges, and a block that
// outlives the capture is freed on it afterwards. It was refused (UNSUPPORTED), being unknown.
TEST_P(GraphPools, AStreamTheBoundCaptureForksToUsesThePoolThoughArcpoolDoesNotKnowIt) {
  arcpool_stream_t s = make_stream(), side = make_app_stream();
  host_bytes host;
  arcpool_allocation_t* before = allocate(kBytes, s);
  begin(s);
  bind(s);
  edge(s, side);  // fork
  arcpool_allocation_t* a = allocate(kBytes, side);
  ASSERT_TRUE(is_pool_block(a));
  EXPECT_EQ(1u, info(a).current_stream_id >> 63) << "named by its marked handle";
  void* const block = data(a);
  fill_async(side, block, kBytes, 3);
  ASSERT_OK(arcpool_deallocate_async(a, side, 0));
  arcpool_allocation_release(a);
  arcpool_allocation_t* b = allocate(kBytes, side);
  EXPECT_EQ(block, data(b)) << "freed earlier on the same stream of the capture";
  fill_async(side, data(b), kBytes, 6);
  // A use record needs the caller's word that the stream outlives the deallocation.
  EXPECT_STATUS(ARCPOOL_STATUS_UNSUPPORTED, arcpool_record_use(before, side));
  EXPECT_NE(nullptr, std::strstr(arcpool_last_error(), "neither created nor registered"))
      << arcpool_last_error();
  // Memory from before the capture cannot be freed there: arcpool could not fence the stream
  // once the graph is gone.
  EXPECT_STATUS(ARCPOOL_STATUS_UNSUPPORTED, arcpool_deallocate_async(before, side, 0));
  ASSERT_OK(arcpool_transfer(b, s));  // a captured edge from the side stream
  EXPECT_EQ(s, info(b).current_stream);
  ASSERT_EQ(cudaSuccess, cudaMemcpyAsync(host.p, data(b), kBytes, cudaMemcpyDefault, cu(s)));
  arcpool_allocation_t* out = allocate(kBytes, side);  // outlives the capture
  fill_async(side, data(out), kBytes, 7);
  edge(side, s);  // join
  ASSERT_OK(arcpool_deallocate_async(b, s, 0));
  arcpool_allocation_release(b);
  cudaGraph_t graph = end(s);
  ASSERT_NE(nullptr, graph);
  ASSERT_OK(arcpool_graph_pool_end(pool_, s));
  cudaGraphExec_t exec = instantiate(graph);
  for (int launch = 0; launch < 3; ++launch) {
    std::memset(host.p, 0, kBytes);
    ASSERT_EQ(cudaSuccess, cudaGraphLaunch(exec, cu(s)));
    sync(s);
    ASSERT_TRUE(host.all(6)) << "launch " << launch;
  }
  EXPECT_EQ(cudaSuccess, cudaGraphExecDestroy(exec));
  EXPECT_EQ(cudaSuccess, cudaGraphDestroy(graph));
  ASSERT_OK(arcpool_deallocate_async(out, side, 0));  // outside captures: with a fence of it
  arcpool_allocation_release(out);
  ASSERT_OK(arcpool_deallocate_async(before, s, 0));
  arcpool_allocation_release(before);
  sync(side);
  sync(s);
  release_pool_and_expect_all_back();
  destroy_app_stream(side);
}

// Such a stream cannot be registered while it captures: arcpool knows it then only by its
// handle, and an entry under that name would be found by no one after the capture (unregister
// answered "not registered"). Registered after the capture, it is known by its identity.
TEST_P(GraphPools, AStreamTheBoundCaptureForksToIsRegisteredOnlyOutsideTheCapture) {
  arcpool_stream_t s = make_stream(), side = make_app_stream();
  begin(s);
  bind(s);
  edge(s, side);  // fork
  EXPECT_STATUS(ARCPOOL_STATUS_UNSUPPORTED, arcpool_stream_register(alloc_, side));
  EXPECT_NE(nullptr, std::strstr(arcpool_last_error(), "register it before the capture"))
      << arcpool_last_error();
  edge(side, s);  // join
  EXPECT_EQ(cudaSuccess, cudaGraphDestroy(end(s)));
  ASSERT_OK(arcpool_graph_pool_end(pool_, s));
  ASSERT_OK(arcpool_stream_register(alloc_, side));
  EXPECT_OK(arcpool_stream_unregister(alloc_, side));
  destroy_app_stream(side);
}

// Without a graph pool bound to the capture, such a stream stays unknown while it captures.
TEST_P(GraphPools, AStreamAnUnboundCaptureForksToIsRefused) {
  arcpool_stream_t s = make_stream(), side = make_app_stream();
  begin(s);
  edge(s, side);  // fork
  arcpool_allocation_t* a = nullptr;
  EXPECT_STATUS(ARCPOOL_STATUS_UNSUPPORTED, arcpool_allocate_async(alloc_, kBytes, 0, side, 0, &a));
  EXPECT_NE(nullptr, std::strstr(arcpool_last_error(), "bound to none of this allocator's graph"))
      << arcpool_last_error();
  EXPECT_EQ(nullptr, a);
  edge(side, s);  // join
  EXPECT_EQ(cudaSuccess, cudaGraphDestroy(end(s)));
  destroy_app_stream(side);
  finish_and_expect_nothing_held();
}

TEST_P(GraphPools, BeginNeedsACapturingStreamAndEndABegin) {
  arcpool_stream_t s = make_stream();
  ASSERT_OK(arcpool_graph_pool_create(alloc_, &pool_));
  EXPECT_STATUS(ARCPOOL_STATUS_INVALID_ARGUMENT, arcpool_graph_pool_begin(pool_, s));
  EXPECT_STATUS(ARCPOOL_STATUS_INVALID_ARGUMENT, arcpool_graph_pool_end(pool_, s));
  begin(s);
  ASSERT_OK(arcpool_graph_pool_begin(pool_, s));
  EXPECT_STATUS(ARCPOOL_STATUS_INVALID_ARGUMENT, arcpool_graph_pool_begin(pool_, s))
      << "one pool per capture";
  cudaGraph_t graph = end(s);
  ASSERT_OK(arcpool_graph_pool_end(pool_, s)) << "after the capture ended, too";
  EXPECT_EQ(cudaSuccess, cudaGraphDestroy(graph));
}

INSTANTIATE_TEST_SUITE_P(Cuda, GraphCapture, ::testing::Values(driver_param(ARCPOOL_DRIVER_CUDA)),
                         [](const ::testing::TestParamInfo<driver_param>& i) {
                           return i.param.name();
                         });
INSTANTIATE_TEST_SUITE_P(Cuda, GraphPools, ::testing::Values(driver_param(ARCPOOL_DRIVER_CUDA)),
                         [](const ::testing::TestParamInfo<driver_param>& i) {
                           return i.param.name();
                         });

}  // namespace
}  // namespace arcpool::test
